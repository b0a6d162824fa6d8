#include "core/swap/external_charges.h"

namespace stensor {

void ExternalCharges::AddAllocation(CUdeviceptr base, Charge charge) {
  MutexLock lock(&mu_);
  allocations_[base] = charge;
}

std::optional<ExternalCharges::Charge> ExternalCharges::RemoveAllocation(CUdeviceptr base) {
  MutexLock lock(&mu_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return std::nullopt;
  const Charge charge = it->second;
  allocations_.erase(it);
  return charge;
}

void ExternalCharges::AddHandle(CUmemGenericAllocationHandle handle, Charge charge) {
  MutexLock lock(&mu_);
  handles_[handle] = Handle{charge};
}

void ExternalCharges::Retain(CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it != handles_.end()) ++it->second.refs;
}

std::optional<ExternalCharges::Charge> ExternalCharges::Release(
    CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return std::nullopt;
  --it->second.refs;
  return EndIfUnheld(it);
}

void ExternalCharges::Map(CUdeviceptr ptr, uint64_t size, CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;
  ++it->second.mappings;
  mappings_[ptr] = {size, handle};
}

absl::InlinedVector<ExternalCharges::Charge, 1> ExternalCharges::Unmap(CUdeviceptr ptr,
                                                                       uint64_t size) {
  absl::InlinedVector<Charge, 1> ended;
  MutexLock lock(&mu_);
  for (auto it = mappings_.lower_bound(ptr); it != mappings_.end() && it->first - ptr < size;) {
    const CUmemGenericAllocationHandle handle = it->second.second;
    it = mappings_.erase(it);
    auto h = handles_.find(handle);
    if (h == handles_.end()) continue;
    --h->second.mappings;
    if (std::optional<Charge> charge = EndIfUnheld(h)) ended.push_back(*charge);
  }
  return ended;
}

std::optional<ExternalCharges::Charge> ExternalCharges::EndIfUnheld(
    absl::flat_hash_map<CUmemGenericAllocationHandle, Handle>::iterator it) {
  if (it->second.refs > 0 || it->second.mappings > 0) return std::nullopt;
  const Charge charge = it->second.charge;
  handles_.erase(it);
  return charge;
}

}  // namespace stensor
