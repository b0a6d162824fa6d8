// Fake driver: stream-ordered memory pools (cuMemPool*, cuDeviceGet/Set
// MemPool, cuMemAllocFromPoolAsync; cuMemAllocAsync takes from the device's
// current pool, memory.cc).
//
// What is modelled, as the driver documents it: each device has a default
// pool (never destroyed) and a current one (cuDeviceSetMemPool). A pool
// counts the bytes in use by the program (USED_MEM_CURRENT, each allocation
// rounded up to the fake's 4 KiB page) and the device memory it holds
// (RESERVED_MEM_CURRENT, charged against the device's capacity). An
// allocation takes the pool's reserved-but-unused memory first and reserves
// only the rest; a free (in stream order) returns its bytes to the pool,
// which keeps them reserved. At the next stream, event or context
// synchronisation the pool releases reserved memory above
// max(used, RELEASE_THRESHOLD) (default threshold 0); cuMemPoolTrimTo
// releases unused memory down to max(used, minBytesToKeep). The _HIGH marks
// are high-water marks since the last reset; they can only be set to 0,
// which resets the mark to the current value. The REUSE_* attributes are
// kept (default 1) and change nothing. Not modelled: host-located pools,
// IPC handle types (both CUDA_ERROR_NOT_SUPPORTED), access from other
// devices (cuMemPoolSetAccess is not exported), export and import of
// pointers, and the driver's own reservation granularity (2 MiB on GPUs):
// reserved memory grows by exactly what an allocation lacks.
#include <algorithm>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "tests/fakecuda/internal.h"

namespace fakecuda {

struct Pool {
  int device = 0;
  bool is_default = false;
  bool destroyed = false;  // by cuMemPoolDestroy, freed when used drops to 0
  uint64_t threshold = 0;
  uint64_t max_size = 0;  // 0: the device's capacity
  uint64_t reserved = 0, used = 0, reserved_high = 0, used_high = 0;
  int reuse[3] = {1, 1, 1};
};

namespace {

struct Pools {
  std::mutex mu;
  std::unordered_set<Pool*> live;   // valid handles; guarded by mu
  std::vector<Pool*> all;           // live and destroyed-but-in-use
  std::vector<Pool*> default_pool;  // per device
  std::vector<Pool*> current;       // per device
};

// Needs p.mu: makes sure the default pools exist.
Pools& GetPools() {
  static Pools* p = [] {
    auto* ps = new Pools;
    for (int d = 0; d < DeviceCount(); ++d) {
      auto* pool = new Pool;
      pool->device = d;
      pool->is_default = true;
      ps->live.insert(pool);
      ps->all.push_back(pool);
      ps->default_pool.push_back(pool);
      ps->current.push_back(pool);
    }
    return ps;
  }();
  return *p;
}

Pool* Live(Pools& ps, CUmemoryPool h) {
  auto* p = reinterpret_cast<Pool*>(h);
  return p != nullptr && ps.live.count(p) ? p : nullptr;
}

// Needs ps.mu. Releases unused reserved memory down to `keep` (never below
// what is in use).
void ReleaseDownTo(Pool* p, uint64_t keep) {
  uint64_t floor = std::max(p->used, keep);
  if (p->reserved > floor) {
    GetDevice(p->device)->Uncharge(p->reserved - floor);
    p->reserved = floor;
  }
  TrimPool(p, p->reserved - p->used);  // what it no longer holds is unmapped
}

// Needs ps.mu: forgets a destroyed pool nothing uses any more.
void MaybeDelete(Pools& ps, Pool* p) {
  if (!p->destroyed || p->used != 0) return;
  ReleaseDownTo(p, 0);
  ps.all.erase(std::find(ps.all.begin(), ps.all.end(), p));
  delete p;
}

}  // namespace

Pool* CurrentPool(int device) {
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  return device >= 0 && device < static_cast<int>(ps.current.size()) ? ps.current[device] : nullptr;
}

CUresult PoolTake(Pool* p, size_t bytes, uintptr_t* kept) {
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  uint64_t idle = p->reserved - p->used;
  uint64_t more = bytes > idle ? bytes - idle : 0;
  if (more > 0) {
    if (p->max_size != 0 && p->reserved + more > p->max_size) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!GetDevice(p->device)->Charge(more)) return CUDA_ERROR_OUT_OF_MEMORY;
    p->reserved += more;
  }
  p->used += bytes;
  p->used_high = std::max(p->used_high, p->used);
  p->reserved_high = std::max(p->reserved_high, p->reserved);
  *kept = TakeFromPool(p, bytes);
  // Memory kept for other sizes that this allocation's reservation now
  // covers is no longer the pool's to keep mapped.
  TrimPool(p, p->reserved - p->used);
  return CUDA_SUCCESS;
}

bool PoolGive(Pool* p, size_t bytes, uintptr_t addr) {
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  p->used -= bytes;
  if (addr != 0 && !p->destroyed) {
    ParkInPool(p, addr, bytes);
    return true;
  }
  MaybeDelete(ps, p);
  return false;
}

int PoolDevice(Pool* p) { return p->device; }

void ReleasePoolsAtSync() {
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  for (Pool* p : ps.all) ReleaseDownTo(p, p->threshold);
}

CUresult LookupPool(CUmemoryPool h, Pool** out) {
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  *out = Live(ps, h);
  return *out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

namespace fakecuda {
namespace {
// cuDeviceGetDefaultMemPool (`current` false) and cuDeviceGetMemPool.
CUresult DevicePool(CUmemoryPool* pool, CUdevice dev, bool current) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  *pool = reinterpret_cast<CUmemoryPool>(current ? ps.current[dev] : ps.default_pool[dev]);
  return CUDA_SUCCESS;
}
}  // namespace
}  // namespace fakecuda

FAKECUDA_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetDefaultMemPool");
  return DevicePool(pool, dev, false);
}

FAKECUDA_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetMemPool");
  return DevicePool(pool, dev, true);
}

FAKECUDA_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  FAKECUDA_ENTER("cuDeviceSetMemPool");
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  Pool* p = Live(ps, pool);
  // The pool must be one of that device's.
  if (p == nullptr || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
  ps.current[dev] = p;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  FAKECUDA_ENTER("cuMemPoolCreate");
  if (pool == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  switch (props->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (GetDevice(props->location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
      break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      return CUDA_ERROR_NOT_SUPPORTED;  // host-located pools: not modelled
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;
  if (props->win32SecurityAttributes != nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* p = new Pool;
  p->device = props->location.id;
  p->max_size = props->maxSize;
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  ps.live.insert(p);
  ps.all.push_back(p);
  *pool = reinterpret_cast<CUmemoryPool>(p);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  FAKECUDA_ENTER("cuMemPoolDestroy");
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  Pool* p = Live(ps, pool);
  if (p == nullptr || p->is_default) return CUDA_ERROR_INVALID_VALUE;
  // "Destroying the current mempool of a device sets the default mempool of
  // that device as the current mempool"; outstanding allocations keep its
  // memory until they are freed.
  if (ps.current[p->device] == p) ps.current[p->device] = ps.default_pool[p->device];
  ps.live.erase(p);
  p->destroyed = true;
  ReleaseDownTo(p, 0);
  MaybeDelete(ps, p);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  FAKECUDA_ENTER("cuMemPoolTrimTo");
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  Pool* p = Live(ps, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ReleaseDownTo(p, minBytesToKeep);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                               void* value) {
  FAKECUDA_ENTER("cuMemPoolGetAttribute");
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  Pool* p = Live(ps, pool);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* u64 = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *u64 = p->threshold;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *u64 = p->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *u64 = p->reserved_high;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *u64 = p->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *u64 = p->used_high;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKECUDA_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                               void* value) {
  FAKECUDA_ENTER("cuMemPoolSetAttribute");
  Pools& ps = GetPools();
  std::lock_guard<std::mutex> lock(ps.mu);
  Pool* p = Live(ps, pool);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t u64 = 0;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] =
          *static_cast<int*>(value) != 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      p->threshold = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    // "It is illegal to set this attribute to a non-zero value": a reset
    // starts the mark again from the current value.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      u64 = *static_cast<cuuint64_t*>(value);
      if (u64 != 0) return CUDA_ERROR_INVALID_VALUE;
      if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
        p->reserved_high = p->reserved;
      } else {
        p->used_high = p->used;
      }
      return CUDA_SUCCESS;
    default:  // the _CURRENT values are read-only
      return CUDA_ERROR_INVALID_VALUE;
  }
}

namespace fakecuda {
namespace {
CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream h, bool pt) {
  Pool* p = nullptr;
  if (CUresult r = LookupPool(pool, &p); r != CUDA_SUCCESS) return r;
  return AllocAsyncFrom(dptr, bytes, p, h, pt);
}
}  // namespace
}  // namespace fakecuda

FAKECUDA_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream hStream) {
  FAKECUDA_ENTER("cuMemAllocFromPoolAsync");
  return AllocFromPool(dptr, bytesize, pool, hStream, false);
}
FAKECUDA_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                      CUmemoryPool pool, CUstream hStream) {
  FAKECUDA_ENTER("cuMemAllocFromPoolAsync_ptsz");
  return AllocFromPool(dptr, bytesize, pool, hStream, true);
}
