// Allocations the driver makes for the program itself under a cap
// (cuMemAllocPitch, cuMemAllocAsync, cuMemAllocFromPoolAsync): stensor does
// not serve or swap them, but they take device memory, so each is charged
// against the cap around the driver's call (room made first, by eviction if
// need be; the charge dropped if the driver fails), and released by
// MemoryManager::ForgetExternal when the program frees it. The program's own
// VMM memory is charged by MemoryManager::CreateAppMemory. Also what the
// program is told of the device's memory under a cap (cuMemGetInfo).
//
// Thread-safety: as MemoryManager's (any thread); the functions keep no
// state of their own.
#ifndef STENSOR_CORE_SWAP_EXTERNAL_ALLOCATIONS_H_
#define STENSOR_CORE_SWAP_EXTERNAL_ALLOCATIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"

namespace stensor {

// What cuMemAllocPitch(width, height) is charged: the driver picks the pitch
// inside the call, so the charge assumes its usual 512-byte alignment of
// each row. nullopt when that overflows 64 bits (no charge can be right;
// the driver refuses such a request).
std::optional<uint64_t> PitchAllocationCharge(uint64_t width, uint64_t height);

// Calls `allocate` (the driver's allocation of `bytes`, returning its
// CUresult and setting *dptr) with `bytes` charged against the cap of
// `memory` (null: no cap; `allocate` is just called). When no room can be
// made, returns the manager's error (CUDA_ERROR_OUT_OF_MEMORY) and
// `allocate` is not called; when the driver fails, the charge is dropped.
// `source`: MemoryManager::ReserveExternal's.
template <typename Allocate>
CUresult ChargedAllocation(
    MemoryManager* memory, CUdeviceptr* dptr, uint64_t bytes, Allocate&& allocate,
    MemoryManager::ExternalSource source = MemoryManager::ExternalSource::kFresh) {
  if (memory == nullptr) return allocate();
  if (CUresult r = memory->ReserveExternal(bytes, source); r != CUDA_SUCCESS) return r;
  CUresult r = allocate();
  if (r == CUDA_SUCCESS && dptr != nullptr) {
    memory->AdoptExternal(*dptr, bytes, source);
  } else {
    memory->UnreserveExternal(bytes);
  }
  return r;
}

// cuMemAllocPitch as ChargedAllocation, charged PitchAllocationCharge; a
// request whose charge overflows goes to the driver uncharged (its error).
template <typename Allocate>
CUresult ChargedPitchAllocation(MemoryManager* memory, CUdeviceptr* dptr, uint64_t width,
                                uint64_t height, Allocate&& allocate) {
  std::optional<uint64_t> charge = PitchAllocationCharge(width, height);
  if (!charge) return allocate();
  return ChargedAllocation(memory, dptr, *charge, allocate);
}

// cuMemGetInfo's answer under the cap of `memory`, for the device of the
// calling thread's context: *total the cap, *free_bytes what is free under
// it (either may be null). Left as the driver's answer when that device
// cannot be told (no current context).
void CappedMemInfo(MemoryManager& memory, const Driver& driver, size_t* free_bytes, size_t* total);

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_EXTERNAL_ALLOCATIONS_H_
