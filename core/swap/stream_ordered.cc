#include "core/swap/stream_ordered.h"

namespace stensor {

bool FromDefaultPool(const Driver& driver) {
  // A driver without pool queries has no pool to set either.
  if (driver.cuDeviceGetMemPool == nullptr || driver.cuDeviceGetDefaultMemPool == nullptr) {
    return true;
  }
  CUdevice device = 0;
  CUmemoryPool current = nullptr, default_pool = nullptr;
  return driver.cuCtxGetDevice(&device) == CUDA_SUCCESS &&
         driver.cuDeviceGetMemPool(&current, device) == CUDA_SUCCESS &&
         driver.cuDeviceGetDefaultMemPool(&default_pool, device) == CUDA_SUCCESS &&
         current == default_pool;
}

bool ServeStreamOrdered(const Driver& driver, MemoryManager& memory, CUdeviceptr* dptr,
                        uint64_t bytes, CUstream stream, MemoryManager::RegisterId register_id,
                        CUresult* result, bool no_room) {
  if (dptr == nullptr || bytes == 0) return false;  // the driver's error
  // Captured: the driver makes a graph allocation node of it. The call also
  // checks the handle (the driver answers for one it refuses).
  if (driver.cuStreamIsCapturing != nullptr) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (driver.cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS ||
        capture != CU_STREAM_CAPTURE_STATUS_NONE) {
      return false;
    }
  }
  // The allocation is the stream's device's, made in the stream's context.
  CUcontext context = nullptr;
  if (StreamContext(driver, stream, &context) != CUDA_SUCCESS) return false;
  ContextScope scope(driver, context);
  if (scope.result() != CUDA_SUCCESS) return false;
  if (!memory.Swappable(bytes) && !(no_room && memory.SmallServedFromHost(bytes))) return false;
  if (!FromDefaultPool(driver)) return false;
  *result = memory.Allocate(bytes, dptr, register_id, &stream);
  // The pop (retried once on failure) is the scope's; the program gets the
  // allocation's result either way: an error after a successful allocation
  // would leave a buffer it never frees.
  return true;
}

int DefaultPoolDevice(const Driver& driver, CUmemoryPool pool) {
  if (pool == nullptr || driver.cuDeviceGetCount == nullptr || driver.cuDeviceGet == nullptr ||
      driver.cuDeviceGetDefaultMemPool == nullptr) {
    return -1;
  }
  int count = 0;
  if (driver.cuDeviceGetCount(&count) != CUDA_SUCCESS) return -1;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice device = 0;
    CUmemoryPool default_pool = nullptr;
    if (driver.cuDeviceGet(&device, ordinal) == CUDA_SUCCESS &&
        driver.cuDeviceGetDefaultMemPool(&default_pool, device) == CUDA_SUCCESS &&
        default_pool == pool) {
      return ordinal;
    }
  }
  return -1;
}

void AddStreamOrderedShare(MemoryManager& memory, const Driver& driver, CUmemoryPool pool,
                           CUmemPool_attribute attr, void* value) {
  if (value == nullptr) return;
  if (attr != CU_MEMPOOL_ATTR_USED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH &&
      attr != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
    return;
  }
  int device = DefaultPoolDevice(driver, pool);
  if (device < 0) return;
  MemoryManager::StreamOrderedUsage ours = memory.StreamOrdered(device);
  uint64_t add = attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT       ? ours.used
                 : attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH        ? ours.used_high
                 : attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? ours.reserved
                                                                : ours.reserved_high;
  *static_cast<cuuint64_t*>(value) += add;
}

void ResetStreamOrderedHigh(MemoryManager& memory, const Driver& driver, CUmemoryPool pool,
                            CUmemPool_attribute attr) {
  if (attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) return;
  int device = DefaultPoolDevice(driver, pool);
  if (device < 0) return;
  memory.ResetStreamOrderedHigh(device, attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                                attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
}

uint64_t TrimStreamOrdered(MemoryManager& memory, const Driver& driver, CUmemoryPool pool,
                           uint64_t keep) {
  int device = DefaultPoolDevice(driver, pool);
  if (device < 0) return 0;
  // What the pool reports reserved counts toward `keep`; a driver that will
  // not tell its own part leaves only stensor's.
  cuuint64_t reported = 0;
  if (driver.cuMemPoolGetAttribute == nullptr ||
      driver.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reported) !=
          CUDA_SUCCESS) {
    reported = 0;
  }
  reported += memory.StreamOrdered(device).reserved;
  return memory.ReleaseIdlePooled(device, keep > reported ? keep - reported : 0);
}

}  // namespace stensor
