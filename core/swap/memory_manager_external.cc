// MemoryManager: device memory the cap counts but stensor does not swap.
// Allocations the driver makes itself (cuMemAllocPitch, stream-ordered
// pools), buffers whose handle left stensor's control (made resident and
// pinned for good), and the program's own VMM memory. Accounting and
// pinning only: the room they need is made by MakeRoom, in
// memory_manager.cc, like any other.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/base/json.h"
#include "core/base/log.h"
#include "core/swap/memory_manager.h"
#include "core/swap/memory_manager_internal.h"
#include "core/swap/stream_use.h"

namespace stensor {

using memory_manager_internal::AlignUp;
using memory_manager_internal::kSmallUnit;
using memory_manager_internal::Seconds;

namespace {

// Stream-ordered frees of driver allocations pending before a free settles
// those observed complete (MemoryManager::ForgetExternalAsync).
constexpr size_t kSettleExternalFrees = 32;

}  // namespace

// --- Allocations the driver makes itself -----------------------------------------

CUresult MemoryManager::ReserveExternal(uint64_t bytes, ExternalSource source) {
  CUdevice ordinal = 0;
  if (CUresult r = driver_->cuCtxGetDevice(&ordinal); r != CUDA_SUCCESS) return r;
  ManagerLock lock(this);
  Device& dev = DeviceState(ordinal);
  if (bytes > dev.cap) {  // never fits; AlignUp would wrap
    LogOom(dev, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uint64_t charge = AlignUp(bytes, kSmallUnit);
  // Frees queued before it stay charged (the header): MakeRoom waits for
  // them where they would make the room. A small one of the default pool
  // finding no room is served from host memory instead (ServeStreamOrdered):
  // not a refusal yet.
  const CUresult room = MakeRoom(dev, charge, HostWait::kAllowed);
  if (room == CUDA_ERROR_OUT_OF_MEMORY &&
      !(source == ExternalSource::kDefaultPool && ServesSmallFromHost(dev, bytes))) {
    LogOom(dev, charge);
  }
  if (room != CUDA_SUCCESS) return room;
  if (source == ExternalSource::kFresh) TrimDriverPool(dev);
  Charge(dev, charge);
  return CUDA_SUCCESS;
}

void MemoryManager::UnreserveExternal(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
  ManagerLock lock(this);
  if (bytes > DeviceState(ordinal).cap) return;  // never charged
  DeviceState(ordinal).used -= AlignUp(bytes, kSmallUnit);
}

void MemoryManager::AdoptExternal(CUdeviceptr base, uint64_t bytes, ExternalSource source) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
  ExternalCharges::Charge charge{ordinal, AlignUp(bytes, kSmallUnit)};
  if (source == ExternalSource::kDefaultPool) {
    // A small one the default pool serves where slabs could hold it.
    ManagerLock lock(this);
    Device& dev = DeviceState(ordinal);
    if (CountsForSlabs(dev, bytes)) {
      dev.slab_onset.Made(bytes, dev.cap);
      charge.before_slabs = bytes;
    }
  }
  external_.AddAllocation(base, charge);
}

void MemoryManager::Uncharge(ExternalCharges::Charge charge) {
  ManagerLock lock(this);
  Device& dev = DeviceState(charge.device);
  dev.used -= charge.bytes;
  dev.slab_onset.Freed(charge.before_slabs);
}

void MemoryManager::ForgetExternal(CUdeviceptr base) {
  if (std::optional<ExternalCharges::Charge> charge = external_.RemoveAllocation(base)) {
    Uncharge(*charge);
  }
}

void MemoryManager::ForgetExternalAsync(CUdeviceptr base, CUstream stream) {
  // Still charged meanwhile: it ends once the free is seen to have run. The
  // program holds it no more from here (SlabOnset).
  std::optional<ExternalCharges::Charge> charge = external_.RemoveAllocation(base);
  if (!charge) return;
  ManagerLock lock(this);
  DeviceState(charge->device).slab_onset.Freed(charge->before_slabs);
  ExternalFree& f = external_frees_.emplace_back();
  f.device = charge->device;
  f.bytes = charge->bytes;
  // Unrecorded (a failed create or record): settled by a wait for the
  // stream's whole context, still in stream order.
  NoteUse(f.uses, stream, f.device);
  // Settled when room is needed or cuMemGetInfo asks; here too once a few
  // are pending, so a program that never runs short keeps no more than
  // that many events.
  if (external_frees_.size() >= kSettleExternalFrees) {
    (void)SettleExternalFrees(f.device, /*wait=*/false);
  }
}

std::list<MemoryManager::ExternalFree>::iterator MemoryManager::DropExternalFree(
    std::list<ExternalFree>::iterator it) {
  // A failed destroy leaks one event; nothing waits on it any more.
  for (const Use& u : it->uses) {
    if (u.own != nullptr) (void)Failed(driver_->cuEventDestroy_v2(u.own));
  }
  return external_frees_.erase(it);
}

uint64_t MemoryManager::QueuedExternalBytes(int device) const {
  uint64_t bytes = 0;
  for (const ExternalFree& f : external_frees_) {
    if (f.device == device) bytes += f.bytes;
  }
  return bytes;
}

bool MemoryManager::SettleExternalFrees(int device, bool wait) {
  bool settled = false;
  for (auto it = external_frees_.begin(); it != external_frees_.end();) {
    ExternalFree& f = *it;
    bool done = f.waiters == 0;
    for (Use& u : f.uses) done = done && Observed(u);
    if (!done) {
      ++it;
      continue;
    }
    DeviceState(f.device).used -= f.bytes;
    settled |= f.device == device;
    it = DropExternalFree(it);
  }
  if (settled || !wait) return settled;
  for (ExternalFree& f : external_frees_) {
    if (f.device != device || f.waiters > 0) continue;
    // Without the lock (the stream may wait for another thread's next
    // launch); the entry and its events stay while it is waited for.
    ++f.waiters;
    std::vector<Use> uses = f.uses;
    const CUstream swap_stream = DeviceState(device).swap_stream;
    auto start = std::chrono::steady_clock::now();
    mu_.Unlock();
    std::vector<CUresult> results;
    for (const Use& u : uses) results.push_back(WaitForUse(u, swap_stream));
    mu_.Lock();
    ApplyJournal();
    --f.waiters;
    const double waited = Seconds(std::chrono::steady_clock::now() - start);
    stats_.host_wait_seconds += waited;
    stats_.wait_program_seconds += waited;
    for (size_t i = 0; i < uses.size() && i < f.uses.size(); ++i) {
      if (Failed(results[i]) == CUDA_SUCCESS) f.uses[i].done = true;
    }
    (void)SettleExternalFrees(device, /*wait=*/false);
    return true;  // callers look again
  }
  return false;
}

// --- Handles that leave stensor's control -----------------------------------------

CUresult MemoryManager::PinLocked(Buffer& b, const char* api) {
  ReindexAtExit reindex(this, b);
  bool first = !b.exported;
  b.exported = true;  // from now on no eviction chooses it
  Device& dev = DeviceState(b.device);
  if (!b.resident() || b.stale_device) {
    Pin(b);
    CUresult r;
    for (;;) {
      r = b.resident() ? RestoreFromHost(dev, b)
                       : SwapIn(dev, b, /*copy=*/true,
                                /*consumer=*/nullptr, HostWait::kAllowed);
      if (r != CUDA_ERROR_NOT_READY || b.resident() || b.serving == 0) break;
      // Served from host to another thread's operation: its address stays
      // on the host copy until that operation finished (no wait on the
      // device here; its completion is waited for by the swap-in).
      auto unserved = [&b]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return b.serving == 0; };
      mu_.Await(absl::Condition(&unserved));
    }
    Unpin(b);
    if (r != CUDA_SUCCESS) {
      if (first) b.exported = false;  // still swapped out: a later call tries again
      if (r == CUDA_ERROR_OUT_OF_MEMORY) LogOom(dev, b.reserved);
      return r;
    }
  }
  // Synchronously: whoever gets the handle reads the memory directly. The
  // swap-in's copy is the buffer's use on a stream of stensor's; wait for it
  // without the lock (the pin keeps the buffer and its uses alive).
  // Copied first: another thread may add uses (reallocating b.uses) while
  // the lock is released.
  const std::vector<Use> copies = PendingOwnUses(dev, b);
  for (const Use& copy : copies) {
    Pin(b);
    mu_.Unlock();
    CUresult w = WaitForUse(copy, copy.stream);
    mu_.Lock();
    ApplyJournal();
    Unpin(b);
    if (Failed(w) != CUDA_SUCCESS) return w;
    for (Use& v : b.uses) {
      if (SameStream(v, copy) && v.seq == copy.seq) v.done = true;
    }
  }
  // Said once per allocation (a group's first piece).
  if (first && &Whole(b) == &b) {
    if (logging()) {
      Log(JsonLine()
              .Str("type", "pin")
              .Str("api", api)
              .Uint("id", ViewOf(b).id)
              .Uint("bytes", ViewOf(b).size)
              .Int("device", b.device)
              .Finish());
    }
    Say(LogLevel::kWarn, "pin",
        absl::StrFormat("buffer %u (%u bytes at 0x%x) stays on the device for good: %s hands its "
                        "memory out of stensor's control",
                        ViewOf(b).id, ViewOf(b).size, ViewOf(b).base, api));
  }
  return CUDA_SUCCESS;
}

bool MemoryManager::PinExported(CUdeviceptr addr, const char* api, CUresult* result) {
  ManagerLock lock(this);
  SettleAhead();
  Buffer* b = Containing(addr);
  if (b == nullptr || b->garbage) return false;
  *result = PinAllocation(*b, api);
  return true;
}

CUresult MemoryManager::PinAllocation(Buffer& b, const char* api) {
  // The handle maps the whole allocation: every piece stays.
  CUresult result = CUDA_SUCCESS;
  for (Buffer* p : PiecesOf(Whole(b))) {
    if (CUresult r = PinLocked(*p, api); result == CUDA_SUCCESS) result = r;
  }
  return result;
}

bool MemoryManager::PinExportedHandle(CUmemGenericAllocationHandle handle, const char* api) {
  ManagerLock lock(this);
  SettleAhead();
  for (auto& [base, b] : by_base_) {
    // A handle is only ever the current device memory of a resident buffer.
    if (b->vmm && handle != 0 &&
        std::any_of(b->device_chunks.begin(), b->device_chunks.end(),
                    [&](const PhysicalChunk& c) { return c.handle == handle; })) {
      // Resident already; a failure (a stale device copy not restored) is
      // still a pin, retried by the next pinning call.
      (void)PinAllocation(*b, api);
      return true;
    }
  }
  return false;
}

// --- The program's own VMM memory --------------------------------------------------

CUresult MemoryManager::CreateAppMemory(CUmemGenericAllocationHandle* handle, size_t size,
                                        const CUmemAllocationProp* prop, unsigned long long flags) {
  bool device_located = prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  if (!device_located || handle == nullptr || size == 0) {
    return driver_->cuMemCreate(handle, size, prop, flags);  // host memory, or the driver's error
  }
  int ordinal = prop->location.id;
  int count = 0;
  if (driver_->cuDeviceGetCount(&count) != CUDA_SUCCESS || ordinal < 0 || ordinal >= count) {
    return driver_->cuMemCreate(handle, size, prop, flags);  // the driver's error
  }
  {
    ManagerLock lock(this);
    Device& dev = DeviceState(ordinal);
    if (dev.granularity != 0 && size % dev.granularity != 0) {
      return driver_->cuMemCreate(handle, size, prop, flags);  // INVALID_VALUE, nothing evicted
    }
    if (CUresult r = MakeRoom(dev, size, HostWait::kAllowed); r != CUDA_SUCCESS) {
      if (r == CUDA_ERROR_OUT_OF_MEMORY) LogOom(dev, size);
      return r;
    }
    TrimDriverPool(dev);  // fresh memory: after what the default pool keeps
    Charge(dev, size);
  }
  // Outside the lock: the charge holds the room meanwhile.
  CUresult r = driver_->cuMemCreate(handle, size, prop, flags);
  ManagerLock lock(this);
  // The device itself may be full below the cap (other processes): evict
  // and retry while anything is left, as for stensor's own memory.
  while (r == CUDA_ERROR_OUT_OF_MEMORY &&
         EvictByPolicy(DeviceState(ordinal), size, HostWait::kAllowed)) {
    r = driver_->cuMemCreate(handle, size, prop, flags);
  }
  if (r != CUDA_SUCCESS) {
    DeviceState(ordinal).used -= size;
    if (r == CUDA_ERROR_OUT_OF_MEMORY) LogOom(DeviceState(ordinal), size);
    return r;
  }
  external_.AddHandle(*handle, {ordinal, size});
  return CUDA_SUCCESS;
}

void MemoryManager::OnAppRetain(CUmemGenericAllocationHandle handle) { external_.Retain(handle); }

void MemoryManager::OnAppRelease(CUmemGenericAllocationHandle handle) {
  if (std::optional<ExternalCharges::Charge> charge = external_.Release(handle)) {
    Uncharge(*charge);
  }
}

void MemoryManager::OnAppMap(CUdeviceptr ptr, uint64_t size, CUmemGenericAllocationHandle handle) {
  external_.Map(ptr, size, handle);
}

void MemoryManager::OnAppUnmap(CUdeviceptr ptr, uint64_t size) {
  for (ExternalCharges::Charge charge : external_.Unmap(ptr, size)) Uncharge(charge);
}

}  // namespace stensor
