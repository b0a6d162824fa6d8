#include "core/swap/host_store.h"

namespace stensor {

std::optional<HostCopy> HostStore::TakeSpare(int device, uint64_t reserved, bool host_vmm,
                                             bool vmm_only) {
  MutexLock lock(&mu_);
  auto it = spares_.find({reserved, device});
  if (it == spares_.end() || it->second.vmm() != host_vmm || (vmm_only && !it->second.vmm())) {
    return std::nullopt;
  }
  HostCopy copy = it->second;
  if (copy.vmm()) devices_[device].spare_vmm -= reserved;
  spares_.erase(it);
  return copy;
}

void HostStore::PutBack(int device, uint64_t reserved, const HostCopy& copy) {
  MutexLock lock(&mu_);
  const std::pair<uint64_t, int> key{reserved, device};
  spares_.emplace_hint(spares_.lower_bound(key), key, copy);
  if (copy.vmm()) devices_[device].spare_vmm += reserved;
}

bool HostStore::Fits(int device, uint64_t reserved, uint64_t limit) {
  MutexLock lock(&mu_);
  const uint64_t held = devices_[device].bytes;
  if (held <= limit && reserved <= limit - held) return true;
  if (spares_.empty()) return false;
  (void)FreeSparesLocked();  // the room is needed (pinned ones: a synchronising free)
  const uint64_t left = devices_[device].bytes;
  return left <= limit && reserved <= limit - left;
}

CUresult HostStore::Create(HostCopy* copy, int device, bool host_vmm, uint64_t reserved,
                           uint64_t size) {
  MutexLock lock(&mu_);
  return copy->Create(vmm_, host_vmm, reserved, size, device, &devices_[device].bytes);
}

bool HostStore::Release(HostCopy* copy, int device, uint64_t reserved, uint64_t keep_up_to) {
  MutexLock lock(&mu_);
  PerDevice& d = devices_[device];
  const bool whole = copy->vmm() || (copy->ptr() != nullptr && copy->handle() == 0);
  if (whole && (!copy->vmm() || d.spare_vmm + reserved <= keep_up_to)) {
    if (copy->vmm()) d.spare_vmm += reserved;
    spares_.emplace(std::make_pair(reserved, device), *copy);
    *copy = HostCopy();
    return true;
  }
  return copy->Release(vmm_, reserved, &d.bytes);
}

bool HostStore::FreeSpares() {
  MutexLock lock(&mu_);
  return FreeSparesLocked();
}

bool HostStore::FreeSparesLocked() {
  bool freed = false;
  for (auto it = spares_.begin(); it != spares_.end();) {
    const auto [reserved, device] = it->first;
    PerDevice& d = devices_[device];
    const bool vmm = it->second.vmm();
    if (!it->second.Release(vmm_, reserved, &d.bytes)) {
      ++it;  // kept (still counted) for a later attempt
      continue;
    }
    if (vmm) d.spare_vmm -= reserved;
    it = spares_.erase(it);
    freed = true;
  }
  return freed;
}

uint64_t HostStore::driver_errors() const {
  MutexLock lock(&mu_);
  return driver_errors_;
}

uint64_t HostStore::bytes(int device) const {
  MutexLock lock(&mu_);
  auto it = devices_.find(device);
  return it == devices_.end() ? 0 : it->second.bytes;
}

}  // namespace stensor
