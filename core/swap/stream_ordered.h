// Stream-ordered allocation under a cap, and the device handling of the
// PyTorch pluggable allocator (interpose/torch_allocator.cc).
//
// Under a cap, a cuMemAllocAsync of at least half the allocation granularity
// is served by stensor (MemoryManager::Allocate: VMM-backed, swappable, the
// same rule as cuMemAlloc), in the context of the stream's device, and its
// cuMemFreeAsync frees it in stream order (MemoryManager::FreeAsync). What
// stays with the driver (and is only charged against the cap,
// core/swap/external_allocations.h): smaller allocations, a null result pointer
// or 0 bytes (the driver's error), a stream being captured into a graph (the
// allocation becomes a graph node there), a stream whose capture status or
// context the driver will not tell (its error), a device whose current pool
// is not its default one (cuDeviceSetMemPool), and every
// cuMemAllocFromPoolAsync.
//
// Thread-safety: the functions keep no state (ContextForDevice's cache is
// core/device_context's).
#ifndef STENSOR_CORE_SWAP_STREAM_ORDERED_H_
#define STENSOR_CORE_SWAP_STREAM_ORDERED_H_

#include <cstdint>

#include "core/driver/context_scope.h"
#include "core/driver/device_context.h"
#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"

namespace stensor {

// Whether cuMemAllocAsync in the current context allocates from its
// device's default pool: false when the program made another pool current
// (cuDeviceSetMemPool), whose properties (IPC handle types, a host
// location, its own release threshold) stensor's memory would not have, or
// when the driver will not say. True for a driver without pool queries.
bool FromDefaultPool(const Driver& driver);

// Whether stensor serves a cuMemAllocAsync of `bytes` on `stream` (a handle
// the driver understands: CU_STREAM_PER_THREAD for handle 0 of a _ptsz entry
// point) under the cap of `memory`; if so it does, in the stream's context,
// registering the buffer with `register_id` (MemoryManager::Allocate), and
// `*result` is the outcome. False: the driver answers (see the top of this
// file for which allocations those are).
// `no_room`: the driver's pool could not be given room for it (the cap is
// full of what stensor cannot swap): a smaller one is then stensor's too,
// served from host memory where the device has host-located VMM
// (MemoryManager::SmallServedFromHost).
bool ServeStreamOrdered(const Driver& driver, MemoryManager& memory, CUdeviceptr* dptr,
                        uint64_t bytes, CUstream stream, MemoryManager::RegisterId register_id,
                        CUresult* result, bool no_room = false);

// --- The default pool's attributes under a cap. What stensor serves for a
// device's default pool is not in the driver's pool, so the pool's answers
// add stensor's share (MemoryManager::StreamOrderedUsage): each function is
// called after the driver's call succeeded, and only for a device's default
// pool.

// The device whose default pool `pool` is; -1 when it is none's (an
// explicit pool, a bad handle) or the driver will not say.
int DefaultPoolDevice(const Driver& driver, CUmemoryPool pool);

// cuMemPoolGetAttribute: adds stensor's share to the driver's `*value` for
// USED_MEM_CURRENT/HIGH (requested bytes) and RESERVED_MEM_CURRENT/HIGH
// (granules). A _HIGH answer is the driver's mark plus stensor's: the
// driver's value at the moment stensor's share peaked is not known, so the
// sum of the two marks bounds the high-water of the sum from above (exact
// when only one side grew since the last reset).
void AddStreamOrderedShare(MemoryManager& memory, const Driver& driver, CUmemoryPool pool,
                           CUmemPool_attribute attr, void* value);

// cuMemPoolSetAttribute of USED_MEM_HIGH or RESERVED_MEM_HIGH (the driver
// accepted it, so the value was 0): stensor's mark restarts too.
void ResetStreamOrderedHigh(MemoryManager& memory, const Driver& driver, CUmemoryPool pool,
                            CUmemPool_attribute attr);

// cuMemPoolTrimTo(pool, keep): idle chunks of stensor's physical pool for
// the device go back to the driver, down to what `keep` leaves after the
// pool's reported reservation (the driver's after its trim, plus
// stensor's). Returns the bytes released.
uint64_t TrimStreamOrdered(MemoryManager& memory, const Driver& driver, CUmemoryPool pool,
                           uint64_t keep);

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_STREAM_ORDERED_H_
