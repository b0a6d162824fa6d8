// Fake driver: device memory over host memory at real, stable addresses.
//
// cuMemAlloc allocations are anonymous mappings. The VMM API is the real
// thing in miniature: a reservation is an mmap(PROT_NONE) range, a physical
// handle a memfd, cuMemMap maps it MAP_FIXED|MAP_SHARED into the reservation
// (no access until cuMemSetAccess), and cuMemUnmap puts PROT_NONE back, so a
// touch of an unmapped range faults. Device-located memory counts against the
// device's capacity; host-located handles do not.
// cuMemCreate, cuMemMap, cuMemUnmap and cuMemRelease take the host time
// FAKECUDA_VMM_LATENCY_US gives them, as on a GPU where they are costly.
//
// Page tables: a GPU sets a mapping's page tables up in cuMemMap /
// cuMemSetAccess, so its first touch costs nothing extra. A fresh mmap here
// has no page-table entries, and under a paravirtualised kernel each one
// costs microseconds at its first touch (2-5 ms per MiB measured, 30-70 times
// a warm memcpy), which would bill every swap-in for the fake's emulation.
// So each handle keeps "home" mappings whose page tables persist, and a
// mapping given read-write access to the whole handle borrows one (mremap
// moves whole page-table pages at 2 MiB alignment) and gives it back at
// cuMemUnmap. A handle mapped at two addresses at once (memory handed on
// while its old address is still being read) takes a second home, and so
// on up to kMaxHomes. Access rights and faults are unchanged.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "tests/fakecuda/host_touch.h"
#include "tests/fakecuda/internal.h"

namespace fakecuda {
namespace {

// Page tables kept for a handle: a mapping of it at `addr`, or, while lent,
// empty there and held by the mapping at `lent_to`.
struct Home {
  void* addr = nullptr;
  uintptr_t lent_to = 0;
};

// Homes per handle at most: one per simultaneous mapping; past that, a
// mapping's pages fault in as usual.
constexpr size_t kMaxHomes = 4;

struct Handle {
  int fd = -1;
  size_t size = 0;
  CUmemAllocationProp prop{};
  int refs = 1;               // user references plus one per mapping
  int user_refs = 1;          // cuMemCreate and each cuMemRetainAllocationHandle
  unsigned long long id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID of its mappings
  // The home mappings (see the top of this file), 2 MiB aligned, made at
  // read-write cuMemSetAccess calls that found none free.
  std::vector<Home> homes;
};

struct Mapping {
  size_t size = 0;
  Handle* handle = nullptr;
  bool accessible = false;
  int prot = PROT_NONE;  // as cuMemSetAccess last set it
  int device = 0;
};

struct Allocation {
  size_t size = 0;     // as requested
  size_t charged = 0;  // page-rounded, what the mapping and the device use
  int device = 0;
  bool stream_ordered = false;  // from cuMemAllocAsync
  Pool* pool = nullptr;         // the stream-ordered pool it came from
  Context* ctx = nullptr;       // where it was allocated
  unsigned long long id = 0;    // CU_POINTER_ATTRIBUTE_BUFFER_ID
};

struct HostRange {
  size_t size = 0;
  bool owned = false;  // cuMemAllocHost/cuMemHostAlloc, not cuMemHostRegister
  Context* ctx = nullptr;
  unsigned long long id = 0;
};

// Buffer ids are unique over the process's lifetime, never reused.
unsigned long long NextBufferId() {
  static std::atomic<unsigned long long> next{1};
  return next.fetch_add(1);
}

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Allocation> allocations;  // guarded by mu
  std::map<uintptr_t, size_t> reservations;     // base -> size, guarded by mu
  std::map<uintptr_t, Mapping> mappings;        // guarded by mu
  std::unordered_set<Handle*> handles;          // guarded by mu
  std::map<uintptr_t, HostRange> pinned;        // guarded by mu
  // Pages of freed allocations, moved away with their page tables, by
  // size: the next allocation of that size takes them (see Allocate).
  std::multimap<size_t, void*> freed_pages;  // guarded by mu
  size_t freed_bytes = 0;                    // guarded by mu
  // Stream-ordered allocations freed to a pool that keeps their memory
  // reserved: still mapped at their address, contents and all, as a pool's
  // memory stays mapped on a GPU until the pool releases it (so a stream-
  // ordered free costs no page-table change here either); the pool's next
  // allocation of the same size takes one back, address included. By pool
  // and size, at most the pool's reserved-but-unused bytes (pool.cc).
  std::multimap<std::pair<Pool*, size_t>, uintptr_t> parked;  // guarded by mu
  std::map<Pool*, uint64_t> parked_bytes;                     // guarded by mu
};

// Freed pages kept at most: past this, a free unmaps.
constexpr size_t kMaxFreedPages = size_t{512} << 20;

Memory& GetMemory() {
  static Memory* m = new Memory;
  return *m;
}

// The entry of `m` whose key is the greatest not above `p`, if it contains p.
template <typename Map, typename SizeOf>
typename Map::iterator Containing(Map& m, uintptr_t p, SizeOf size_of) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p < it->first + size_of(it->second) ? it : m.end();
}

size_t AllocSize(const Allocation& a) { return a.charged; }
size_t MapSize(const Mapping& m) { return m.size; }
size_t RangeSize(size_t s) { return s; }
size_t HostSize(const HostRange& h) { return h.size; }

// Whether [p, p+n) is covered by contiguous accessible mappings. Needs m.mu.
bool MappedAccessible(Memory& m, uintptr_t p, size_t n) {
  uintptr_t end = p + n;
  while (p < end) {
    auto it = Containing(m.mappings, p, MapSize);
    if (it == m.mappings.end() || !it->second.accessible) return false;
    p = it->first + it->second.size;
  }
  return true;
}

void DestroyHandleLocked(Memory& m, Handle* h) {
  if (h->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    GetDevice(h->prop.location.id)->Uncharge(h->size);
  }
  for (const Home& home : h->homes) munmap(home.addr, h->size);
  close(h->fd);
  m.handles.erase(h);
  delete h;
}

void DropHandleRefLocked(Memory& m, Handle* h) {
  if (--h->refs == 0) DestroyHandleLocked(m, h);
}

// A shared read-write mapping of the handle at a 2 MiB-aligned address (so
// mremap can move its page tables whole), or null when none can be made.
void* MakeHome(Handle* h) {
  size_t span = h->size + kGranularity;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = AlignUp(reinterpret_cast<uintptr_t>(raw), kGranularity);
  void* got = mmap(reinterpret_cast<void*>(start), h->size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, h->fd, 0);
  // The slack on either side goes back; on failure, all of it.
  uintptr_t lo = reinterpret_cast<uintptr_t>(raw);
  if (got == MAP_FAILED) {
    munmap(raw, span);
    return nullptr;
  }
  if (start > lo) munmap(raw, start - lo);
  if (lo + span > start + h->size) {
    munmap(reinterpret_cast<void*>(start + h->size), lo + span - (start + h->size));
  }
  return got;
}

Home* HomeLentTo(Handle* h, uintptr_t p) {
  for (Home& home : h->homes) {
    if (home.lent_to == p) return &home;
  }
  return nullptr;
}

// Moves a free home's page tables (a new home's when none is free) onto the
// mapping at p (which maps all of h), read-write. False (nothing changed)
// when that cannot be done.
bool BorrowHome(Handle* h, uintptr_t p) {
  if (HomeLentTo(h, p) != nullptr) return false;  // holds one already
  Home* home = HomeLentTo(h, 0);
  if (home == nullptr) {
    if (h->homes.size() >= kMaxHomes) return false;
    void* addr = MakeHome(h);
    if (addr == nullptr) return false;
    home = &h->homes.emplace_back(Home{addr, 0});
  }
  // DONTUNMAP keeps the home's range mapped (empty), so no other mmap can
  // take it before the page tables come back.
  void* got = mremap(home->addr, h->size, h->size, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
                     reinterpret_cast<void*>(p));
  if (got == MAP_FAILED) return false;
  home->lent_to = p;
  return true;
}

// Puts an inaccessible placeholder back over [p, p+n), keeping the VA. If
// that failed, the old memory would stay readable where it must fault, so
// the fake stops instead of lying.
void Unback(uintptr_t p, size_t n) {
  void* got = mmap(reinterpret_cast<void*>(p), n, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (got == MAP_FAILED) {
    std::fprintf(stderr, "fakecuda: cannot unmap [%#lx, +%zu): %s\n", static_cast<unsigned long>(p),
                 n, std::strerror(errno));
    std::abort();
  }
}

// A stream-ordered allocation from `pool` is charged to the pool (which
// charges its device for what it reserves) and lives on the pool's device.
CUresult Allocate(CUdeviceptr* dptr, size_t bytes, bool stream_ordered, Pool* pool = nullptr) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (bytes > GetOptions().device_memory) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t charged = AlignUp(bytes, kPageSize);
  int device = pool != nullptr ? PoolDevice(pool) : ctx->device;
  Device* dev = GetDevice(device);
  auto uncharge = [&] {
    if (pool != nullptr) {
      PoolGive(pool, charged, 0);
    } else {
      dev->Uncharge(charged);
    }
  };
  uintptr_t kept = 0;  // memory the pool kept mapped, taken back
  if (pool != nullptr) {
    if (CUresult r = PoolTake(pool, charged, &kept); r != CUDA_SUCCESS) return r;
  } else if (!dev->Charge(charged)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Memory& m = GetMemory();
  std::unique_lock<std::mutex> lock(m.mu);
  if (kept != 0) {
    m.allocations[kept] =
        Allocation{bytes, charged, device, stream_ordered, pool, ctx, NextBufferId()};
    *dptr = static_cast<CUdeviceptr>(kept);
    return CUDA_SUCCESS;
  }
  // A GPU's allocation has its page tables from the start; a fresh mmap
  // here faults at each page's first touch (microseconds each under a
  // paravirtualised kernel, as for VMM memory above), which would bill a
  // program's per-step temporaries for the fake's emulation. So the pages
  // of a freed allocation of this size are taken, zeroed as fresh memory
  // is, at the address they were moved to (never the freed one's).
  void* p = MAP_FAILED;
  if (auto it = m.freed_pages.find(charged); it != m.freed_pages.end()) {
    p = it->second;
    m.freed_bytes -= charged;
    m.freed_pages.erase(it);
    lock.unlock();
    std::memset(p, 0, charged);  // ours alone now
    lock.lock();
  } else {
    lock.unlock();
    p = mmap(nullptr, charged, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    lock.lock();
  }
  if (p == MAP_FAILED) {
    lock.unlock();  // pool.cc's lock comes before ours
    uncharge();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m.allocations[reinterpret_cast<uintptr_t>(p)] =
      Allocation{bytes, charged, device, stream_ordered, pool, ctx, NextBufferId()};
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

// Removes the allocation at exactly `dptr` from the table; the caller unmaps.
CUresult TakeAllocation(CUdeviceptr dptr, Allocation* out) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.allocations.find(static_cast<uintptr_t>(dptr));
  if (it == m.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  *out = it->second;
  m.allocations.erase(it);
  return CUDA_SUCCESS;
}

// Needs m.mu. Unmaps [addr, +charged) (a stale pointer into it faults)
// and keeps its pages for a later allocation when there is room for them.
void DiscardLocked(Memory& m, uintptr_t addr, size_t charged) {
  void* old = reinterpret_cast<void*>(addr);
  if (m.freed_bytes + charged <= kMaxFreedPages) {
    // A placeholder picks the new address; mremap moves pages and page
    // tables onto it and leaves the old range unmapped.
    void* to =
        mmap(nullptr, charged, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* moved = to == MAP_FAILED
                      ? MAP_FAILED
                      : mremap(old, charged, charged, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    if (moved != MAP_FAILED) {
      m.freed_pages.emplace(charged, moved);
      m.freed_bytes += charged;
      return;
    }
    if (to != MAP_FAILED) munmap(to, charged);
  }
  munmap(old, charged);
}

// A stream-ordered allocation goes back to its pool, which keeps it mapped
// while the pool lives; any other is unmapped.
void ReleaseAllocation(CUdeviceptr dptr, const Allocation& a) {
  if (a.pool != nullptr) {
    if (PoolGive(a.pool, a.charged, static_cast<uintptr_t>(dptr))) return;
  } else {
    GetDevice(a.device)->Uncharge(a.charged);
  }
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  DiscardLocked(m, static_cast<uintptr_t>(dptr), a.charged);
}

}  // namespace

void ParkInPool(Pool* pool, uintptr_t addr, size_t charged) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.parked.emplace(std::make_pair(pool, charged), addr);
  m.parked_bytes[pool] += charged;
}

uintptr_t TakeFromPool(Pool* pool, size_t charged) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.parked.find(std::make_pair(pool, charged));
  if (it == m.parked.end()) return 0;
  uintptr_t addr = it->second;
  m.parked.erase(it);
  m.parked_bytes[pool] -= charged;
  return addr;
}

void TrimPool(Pool* pool, uint64_t keep) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto bytes = m.parked_bytes.find(pool);
  if (bytes == m.parked_bytes.end()) return;
  auto it = m.parked.lower_bound(std::make_pair(pool, size_t{0}));
  while (bytes->second > keep && it != m.parked.end() && it->first.first == pool) {
    DiscardLocked(m, it->second, it->first.second);
    bytes->second -= it->first.second;
    it = m.parked.erase(it);
  }
  if (bytes->second == 0) m.parked_bytes.erase(bytes);
}

namespace {

bool ValidLocation(const CUmemLocation& loc, CUresult* error) {
  switch (loc.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (GetDevice(loc.id) == nullptr) {
        *error = CUDA_ERROR_INVALID_DEVICE;
        return false;
      }
      return true;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      if (!GetOptions().host_vmm) {
        *error = CUDA_ERROR_NOT_SUPPORTED;
        return false;
      }
      return true;
    default:
      *error = CUDA_ERROR_INVALID_VALUE;
      return false;
  }
}

CUresult ValidProp(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult error = CUDA_ERROR_INVALID_VALUE;
  return ValidLocation(prop->location, &error) ? CUDA_SUCCESS : error;
}

}  // namespace

bool IsDeviceRange(CUdeviceptr ptr, size_t bytes) {
  uintptr_t p = static_cast<uintptr_t>(ptr);
  if (p + bytes < p) return false;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto a = Containing(m.allocations, p, AllocSize);
  if (a != m.allocations.end()) {
    // Bounded by the requested size, as the real driver checks it, not the
    // page the fake rounded it up to.
    return p + bytes <= a->first + a->second.size;
  }
  return MappedAccessible(m, p, std::max<size_t>(bytes, 1));
}

bool IsDevicePointer(CUdeviceptr ptr) {
  uintptr_t p = static_cast<uintptr_t>(ptr);
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  return Containing(m.allocations, p, AllocSize) != m.allocations.end() ||
         Containing(m.reservations, p, RangeSize) != m.reservations.end();
}

bool IsPinnedHost(const void* ptr, size_t bytes) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = Containing(m.pinned, p, HostSize);
  if (it != m.pinned.end()) return p + bytes <= it->first + it->second.size;
  // Host-located VMM memory is page-locked too.
  auto mp = Containing(m.mappings, p, MapSize);
  return mp != m.mappings.end() &&
         mp->second.handle->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE;
}

bool InVmmMapping(CUdeviceptr p) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  return Containing(m.mappings, static_cast<uintptr_t>(p), MapSize) != m.mappings.end();
}

void WatchHostMapped(const uint64_t* words, size_t n, HostTouches* touches) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);  // the mappings stay as they are watched
  std::vector<uintptr_t> seen;             // reservations, each watched once
  for (size_t i = 0; i < n; ++i) {
    // Mappings lie in reserved ranges: a word in none reaches no mapping.
    auto range = Containing(m.reservations, static_cast<uintptr_t>(words[i]), RangeSize);
    if (range == m.reservations.end() ||
        std::find(seen.begin(), seen.end(), range->first) != seen.end()) {
      continue;
    }
    seen.push_back(range->first);
    const uintptr_t end = range->first + range->second;
    for (auto mp = m.mappings.lower_bound(range->first); mp != m.mappings.end() && mp->first < end;
         ++mp) {
      if (mp->second.handle->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) continue;
      touches->Watch(mp->first, mp->second.size, mp->second.prot);
    }
  }
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

// --- cuMemAlloc family -------------------------------------------------------
FAKECUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FAKECUDA_ENTER("cuMemAlloc_v2");
  // Potentially unsafe during stream capture, as cuMemAllocPitch and
  // cuMemFree (cuThreadExchangeStreamCaptureMode).
  if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  return Allocate(dptr, bytesize, false);
}

FAKECUDA_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                            size_t height, unsigned int element_size) {
  FAKECUDA_ENTER("cuMemAllocPitch_v2");
  if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  if (pitch == nullptr || width == 0 || height == 0 ||
      (element_size != 4 && element_size != 8 && element_size != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t p = AlignUp(width, 512);  // the pitch alignment of current GPUs
  if (p / 512 > (~size_t{0} / 512) / height) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = Allocate(dptr, p * height, false);
  if (r == CUDA_SUCCESS) *pitch = p;
  return r;
}

FAKECUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKECUDA_ENTER("cuMemFree_v2");
  if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;  // as free(NULL): driver 580 on an H200
  Allocation a;
  if (CUresult r = TakeAllocation(dptr, &a); r != CUDA_SUCCESS) return r;
  // Freeing waits for work that may still use the memory, except for
  // stream-ordered allocations: there "callers must ensure that all
  // accesses ... have completed", and an access after this faults.
  if (!a.stream_ordered) SynchronizeAllContexts();
  ReleaseAllocation(dptr, a);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  FAKECUDA_ENTER("cuMemGetInfo_v2");
  // Either output may be null: driver 580 on an H200 answers CUDA_SUCCESS
  // and fills in the other.
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  size_t total = GetOptions().device_memory;
  if (total_bytes != nullptr) *total_bytes = total;
  if (free_bytes != nullptr) *free_bytes = total - GetDevice(ctx->device)->used.load();
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                 CUdeviceptr dptr) {
  FAKECUDA_ENTER("cuMemGetAddressRange_v2");
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t p = static_cast<uintptr_t>(dptr);
  uintptr_t base = 0;
  size_t size = 0;
  auto a = Containing(m.allocations, p, AllocSize);
  if (a != m.allocations.end()) {
    base = a->first;
    size = a->second.size;
    if (p >= base + size) return CUDA_ERROR_NOT_FOUND;
  } else {
    auto mp = Containing(m.mappings, p, MapSize);
    if (mp == m.mappings.end()) return CUDA_ERROR_NOT_FOUND;
    base = mp->first;
    size = mp->second.size;
  }
  if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(base);
  if (psize != nullptr) *psize = size;
  return CUDA_SUCCESS;
}

CUresult fakecuda::AllocAsyncFrom(CUdeviceptr* dptr, size_t bytes, Pool* pool, CUstream h,
                                  bool pt) {
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  // Memory allocation nodes are not modelled.
  if (capturing) return CaptureUnsupported(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  // No bytes: CUDA_SUCCESS (driver 580 on an H200) and, assumed here, a null
  // pointer, which cuMemFreeAsync takes back as a no-op.
  if (bytes == 0 && dptr != nullptr) {
    *dptr = 0;
    return CUDA_SUCCESS;
  }
  // From the current pool of the stream's device.
  if (pool == nullptr) pool = CurrentPool(s->context()->device);
  // Memory is available at once; the real driver makes it usable in stream
  // order, which the same address satisfies.
  return Allocate(dptr, bytes, true, pool);
}

namespace {

CUresult FreeAsync(CUdeviceptr dptr, CUstream h, bool pt) {
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  // Memory free nodes are not modelled.
  if (capturing) return CaptureUnsupported(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (dptr == 0) return CUDA_SUCCESS;  // as cuMemFree(0): driver 580 on an H200
  Allocation a;
  if (CUresult r = TakeAllocation(dptr, &a); r != CUDA_SUCCESS) return r;
  Submit(
      s, [dptr, a] { ReleaseAllocation(dptr, a); }, {}, OpLabel{OpKind::kFree});
  return CUDA_SUCCESS;
}
}  // namespace

FAKECUDA_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  FAKECUDA_ENTER("cuMemAllocAsync");
  return AllocAsyncFrom(dptr, bytesize, nullptr, hStream, false);
}
FAKECUDA_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                              CUstream hStream) {
  FAKECUDA_ENTER("cuMemAllocAsync_ptsz");
  return AllocAsyncFrom(dptr, bytesize, nullptr, hStream, true);
}
FAKECUDA_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  FAKECUDA_ENTER("cuMemFreeAsync");
  return FreeAsync(dptr, hStream, false);
}
FAKECUDA_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  FAKECUDA_ENTER("cuMemFreeAsync_ptsz");
  return FreeAsync(dptr, hStream, true);
}

// --- Page-locked host memory -------------------------------------------------
FAKECUDA_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  FAKECUDA_ENTER("cuMemHostAlloc");
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  // No bytes: CUDA_SUCCESS (driver 580 on an H200) and, assumed here, a null
  // pointer, which cuMemFreeHost takes back as a no-op.
  if (bytesize == 0) {
    *pp = nullptr;
    return CUDA_SUCCESS;
  }
  size_t size = AlignUp(bytesize, kPageSize);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.pinned[reinterpret_cast<uintptr_t>(p)] = HostRange{size, true, ctx, NextBufferId()};
  *pp = p;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  FAKECUDA_ENTER("cuMemAllocHost_v2");
  return cuMemHostAlloc(pp, bytesize, 0);
}

FAKECUDA_EXPORT CUresult cuMemFreeHost(void* p) {
  FAKECUDA_ENTER("cuMemFreeHost");
  if (p == nullptr) return CUDA_SUCCESS;  // as free(NULL): driver 580 on an H200
  size_t size = 0;
  {
    Memory& m = GetMemory();
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.pinned.find(reinterpret_cast<uintptr_t>(p));
    if (it == m.pinned.end() || !it->second.owned) return CUDA_ERROR_INVALID_VALUE;
    size = it->second.size;
    m.pinned.erase(it);
  }
  SynchronizeAllContexts();  // async copies may still read or write it
  munmap(p, size);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  FAKECUDA_ENTER("cuMemHostRegister_v2");
  if (p == nullptr || bytesize == 0 || (flags & ~0xfu) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t b = reinterpret_cast<uintptr_t>(p);
  auto it = m.pinned.lower_bound(b);
  bool overlaps = (it != m.pinned.end() && it->first < b + bytesize) ||
                  Containing(m.pinned, b, HostSize) != m.pinned.end();
  if (overlaps) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  m.pinned[b] = HostRange{bytesize, false, CurrentContext(), NextBufferId()};
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemHostUnregister(void* p) {
  FAKECUDA_ENTER("cuMemHostUnregister");
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.pinned.end() || it->second.owned) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  m.pinned.erase(it);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p,
                                                      unsigned int flags) {
  FAKECUDA_ENTER("cuMemHostGetDevicePointer_v2");
  if (pdptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!IsPinnedHost(p, 1)) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing
  return CUDA_SUCCESS;
}

// --- Virtual memory management -------------------------------------------------
FAKECUDA_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                       const CUmemAllocationProp* prop,
                                                       CUmemAllocationGranularity_flags option) {
  FAKECUDA_ENTER("cuMemGetAllocationGranularity");
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = ValidProp(prop); r != CUDA_SUCCESS) return r;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                             CUdeviceptr addr, unsigned long long flags) {
  FAKECUDA_ENTER("cuMemAddressReserve");
  // Sizes need only be whole host pages; mappings inside need granules.
  if (ptr == nullptr || size == 0 || size % kPageSize != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  alignment = std::max(alignment, kGranularity);
  size_t span;
  if (__builtin_add_overflow(size, alignment, &span)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* raw = mmap(reinterpret_cast<void*>(addr), span, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  uintptr_t base = AlignUp(begin, alignment);
  if (base > begin) munmap(raw, base - begin);
  if (begin + span > base + size) {
    munmap(reinterpret_cast<void*>(base + size), begin + span - base - size);
  }
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.reservations[base] = size;
  *ptr = static_cast<CUdeviceptr>(base);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKECUDA_ENTER("cuMemAddressFree");
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t base = static_cast<uintptr_t>(ptr);
  auto it = m.reservations.find(base);
  if (it == m.reservations.end() || it->second != size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto mp = m.mappings.lower_bound(base);
  if (mp != m.mappings.end() && mp->first < base + size) {
    return CUDA_ERROR_INVALID_VALUE;  // still mapped: unmap first
  }
  munmap(reinterpret_cast<void*>(base), size);
  m.reservations.erase(it);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  FAKECUDA_ENTER("cuMemCreate");
  VmmLatency latency(VmmCall::kCreate);  // FAKECUDA_VMM_LATENCY_US
  latency.set_host_located(prop != nullptr && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE);
  if (handle == nullptr || size == 0 || size % kGranularity != 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = ValidProp(prop); r != CUDA_SUCCESS) return r;
  bool on_device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  if (on_device && !GetDevice(prop->location.id)->Charge(size)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  int fd = memfd_create(on_device ? "fakecuda-device" : "fakecuda-host", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    if (on_device) GetDevice(prop->location.id)->Uncharge(size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto* h = new Handle;
  h->fd = fd;
  h->size = size;
  h->prop = *prop;
  h->id = NextBufferId();
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.handles.insert(h);
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(h);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKECUDA_ENTER("cuMemRelease");
  VmmLatency latency(VmmCall::kRelease);  // FAKECUDA_VMM_LATENCY_US
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto* h = reinterpret_cast<Handle*>(handle);
  if (m.handles.count(h) == 0 || h->user_refs == 0) return CUDA_ERROR_INVALID_VALUE;
  latency.set_host_located(h->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE);
  // Physical memory lives on until its last mapping is unmapped.
  --h->user_refs;
  DropHandleRefLocked(m, h);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  FAKECUDA_ENTER("cuMemMap");
  VmmLatency latency(VmmCall::kMap);  // FAKECUDA_VMM_LATENCY_US
  uintptr_t p = static_cast<uintptr_t>(ptr);
  // As in the real driver, the offset must be 0 and sizes whole granules.
  if (flags != 0 || offset != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  // An address or size that is not whole granules is CUDA_ERROR_NOT_SUPPORTED,
  // checked before whether the range is free: driver 580 on an H200 answered
  // so for 4 KiB at 4 KiB into a mapped granule, and CUDA_ERROR_INVALID_VALUE
  // for the whole granule mapped again.
  if (size % kGranularity != 0 || p % kGranularity != 0) return CUDA_ERROR_NOT_SUPPORTED;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto* h = reinterpret_cast<Handle*>(handle);
  if (m.handles.count(h) == 0 || h->user_refs == 0 || size > h->size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  latency.set_host_located(h->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE);
  auto r = Containing(m.reservations, p, RangeSize);
  if (r == m.reservations.end() || p + size > r->first + r->second) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto next = m.mappings.lower_bound(p);
  if ((next != m.mappings.end() && next->first < p + size) ||
      Containing(m.mappings, p, MapSize) != m.mappings.end()) {
    return CUDA_ERROR_INVALID_VALUE;  // already mapped
  }
  void* got = mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0);
  if (got == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++h->refs;
  int device = h->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? h->prop.location.id : 0;
  Mapping mapping;
  mapping.size = size;
  mapping.handle = h;
  mapping.device = device;  // no access (prot) until cuMemSetAccess
  m.mappings[p] = mapping;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                        size_t count) {
  FAKECUDA_ENTER("cuMemSetAccess");
  VmmLatency latency(VmmCall::kSetAccess);  // FAKECUDA_VMM_LATENCY_US
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    CUresult error = CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!ValidLocation(desc[i].location, &error)) return error;
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_NONE:
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ:
        prot |= PROT_READ;
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        prot |= PROT_READ | PROT_WRITE;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t p = static_cast<uintptr_t>(ptr);
  // The whole range must be mapped, and start and end on mapping boundaries.
  if (m.mappings.count(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Mapping*> covered;
  for (uintptr_t q = p; q < p + size;) {
    auto it = m.mappings.find(q);
    if (it == m.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    covered.push_back(&it->second);
    q += it->second.size;
    if (q > p + size) return CUDA_ERROR_INVALID_VALUE;
  }
  latency.set_mappings(static_cast<int>(covered.size()));
  // A kernel's page counting lets go of them first (host_touch.h).
  ForgetHostTouches(p, size);
  // Read-write over whole handles: each mapping borrows its handle's page
  // tables where it can; the rest get their access by mprotect.
  uintptr_t q = p;
  for (Mapping* mp : covered) {
    Handle* h = mp->handle;
    if (h->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) latency.set_host_located(true);
    const bool borrowed =
        prot == (PROT_READ | PROT_WRITE) && h->size == mp->size && BorrowHome(h, q);
    if (!borrowed && mprotect(reinterpret_cast<void*>(q), mp->size, prot) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    q += mp->size;
  }
  for (Mapping* mp : covered) {
    mp->accessible = prot != PROT_NONE;
    mp->prot = prot;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKECUDA_ENTER("cuMemUnmap");
  VmmLatency latency(VmmCall::kUnmap);  // FAKECUDA_VMM_LATENCY_US
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t p = static_cast<uintptr_t>(ptr);
  // The range must begin in a reservation; the mappings in it are unmapped,
  // and one that crosses its start or end is CUDA_ERROR_INVALID_VALUE. A
  // range with nothing mapped in it is CUDA_SUCCESS: driver 580 on an H200
  // answered so for 4 KiB at the start of a reservation whose one mapping
  // had been unmapped (a range of cuMemAlloc memory is refused).
  if (size == 0 || p + size < p ||
      Containing(m.reservations, p, RangeSize) == m.reservations.end()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (Containing(m.mappings, p, MapSize) != m.mappings.end() && m.mappings.count(p) == 0) {
    return CUDA_ERROR_INVALID_VALUE;  // a mapping begins before the range
  }
  std::vector<uintptr_t> bases;
  for (auto it = m.mappings.lower_bound(p); it != m.mappings.end() && it->first < p + size; ++it) {
    if (it->first + it->second.size > p + size) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.handle->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
      latency.set_host_located(true);
    }
    bases.push_back(it->first);
  }
  latency.set_mappings(static_cast<int>(bases.size()));
  if (bases.empty()) return CUDA_SUCCESS;
  // A kernel's page counting lets go of them first (host_touch.h).
  for (uintptr_t b : bases) ForgetHostTouches(b, m.mappings[b].size);
  for (uintptr_t b : bases) {
    Handle* h = m.mappings[b].handle;
    Home* home = HomeLentTo(h, b);
    if (home == nullptr) continue;
    // The page tables go home; the range is made inaccessible just below.
    // Should the move fail, the home is dropped instead (another is made at
    // a later borrow, its pages faulted in afresh).
    if (mremap(reinterpret_cast<void*>(b), h->size, h->size,
               MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, home->addr) == MAP_FAILED ||
        // The move brings the mapping's protection along; a home is
        // read-write, or the next borrower would inherit a read-only one.
        (m.mappings[b].prot != (PROT_READ | PROT_WRITE) &&
         mprotect(home->addr, h->size, PROT_READ | PROT_WRITE) != 0)) {
      munmap(home->addr, h->size);
      h->homes.erase(h->homes.begin() + (home - h->homes.data()));
    } else {
      home->lent_to = 0;
    }
  }
  for (uintptr_t b : bases) Unback(b, m.mappings[b].size);
  for (uintptr_t b : bases) {
    Handle* h = m.mappings[b].handle;
    m.mappings.erase(b);
    DropHandleRefLocked(m, h);
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                     void* addr) {
  FAKECUDA_ENTER("cuMemRetainAllocationHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto mp = Containing(m.mappings, reinterpret_cast<uintptr_t>(addr), MapSize);
  if (mp == m.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  Handle* h = mp->second.handle;
  // The retained handle needs its own cuMemRelease, like a created one.
  ++h->refs;
  ++h->user_refs;
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(h);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  FAKECUDA_ENTER("cuMemGetAllocationPropertiesFromHandle");
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto* h = reinterpret_cast<Handle*>(handle);
  if (m.handles.count(h) == 0) return CUDA_ERROR_INVALID_VALUE;
  *prop = h->prop;
  return CUDA_SUCCESS;
}

// --- Pointer attributes ----------------------------------------------------------
namespace fakecuda {
namespace {

// What the driver knows about one address.
struct PointerInfo {
  enum Kind { kUnknown, kAlloc, kVmm, kHost } kind = kUnknown;
  uintptr_t base = 0;  // the allocation, reservation or host range
  size_t size = 0;
  Context* ctx = nullptr;
  int device = -1;
  unsigned long long id = 0;
  bool stream_ordered = false;
  bool mapped = false;        // kVmm: backed by a mapping
  bool host_located = false;  // kVmm: the mapping's handle is host memory
};

PointerInfo Describe(uintptr_t p) {
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  PointerInfo info;
  auto a = Containing(m.allocations, p, AllocSize);
  if (a != m.allocations.end()) {
    // Past the requested size is no allocation, as for the real driver.
    if (p >= a->first + a->second.size) return info;
    info.kind = PointerInfo::kAlloc;
    info.base = a->first;
    info.size = a->second.size;
    info.ctx = a->second.ctx;
    info.device = a->second.device;
    info.id = a->second.id;
    info.stream_ordered = a->second.stream_ordered;
    return info;
  }
  auto r = Containing(m.reservations, p, RangeSize);
  if (r != m.reservations.end()) {
    info.kind = PointerInfo::kVmm;
    info.base = r->first;  // "the mappable address range" (cuMemAddressReserve)
    info.size = r->second;
    auto mp = Containing(m.mappings, p, MapSize);
    if (mp != m.mappings.end()) {
      const Handle& h = *mp->second.handle;
      info.mapped = true;
      info.id = h.id;
      info.host_located = h.prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE;
      if (!info.host_located) info.device = h.prop.location.id;
    }
    return info;
  }
  auto h = Containing(m.pinned, p, HostSize);
  if (h != m.pinned.end()) {
    info.kind = PointerInfo::kHost;
    info.base = h->first;
    info.size = h->second.size;
    info.ctx = h->second.ctx;
    info.device = h->second.ctx != nullptr ? h->second.ctx->device : 0;
    info.id = h->second.id;
  }
  return info;
}

// Bytes the driver writes for `attr`, 0 for attributes the fake does not model.
size_t AttributeSize(CUpointer_attribute attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return sizeof(void*);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      return sizeof(unsigned int);
    default:
      return 0;
  }
}

template <typename T>
CUresult Put(void* data, T value) {
  std::memcpy(data, &value, sizeof(value));
  return CUDA_SUCCESS;
}

// One attribute of a known pointer, with the driver's rules: an attribute
// that does not apply to that memory is CUDA_ERROR_INVALID_VALUE.
CUresult Attribute(const PointerInfo& info, uintptr_t p, CUpointer_attribute attr, void* data) {
  if (attr < CU_POINTER_ATTRIBUTE_CONTEXT || attr > CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (AttributeSize(attr) == 0) return CUDA_ERROR_NOT_SUPPORTED;  // not modelled
  if (data == nullptr || info.kind == PointerInfo::kUnknown) return CUDA_ERROR_INVALID_VALUE;
  bool vmm = info.kind == PointerInfo::kVmm;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      // VMM memory belongs to no context; the fake does not model what
      // the driver answers there.
      if (vmm) return CUDA_ERROR_NOT_SUPPORTED;
      return Put(data, reinterpret_cast<CUcontext>(info.ctx));
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      if (vmm && !info.mapped) return CUDA_ERROR_INVALID_VALUE;
      return Put(data,
                 static_cast<unsigned int>(info.kind == PointerInfo::kHost || info.host_located
                                               ? CU_MEMORYTYPE_HOST
                                               : CU_MEMORYTYPE_DEVICE));
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (vmm && !info.mapped) return CUDA_ERROR_INVALID_VALUE;
      return Put(data, static_cast<CUdeviceptr>(p));  // unified addressing
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      // Device memory has no host address; page-locked memory is its own.
      if (info.kind != PointerInfo::kHost) return CUDA_ERROR_INVALID_VALUE;
      return Put(data, reinterpret_cast<void*>(p));
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      if (vmm && !info.mapped) return CUDA_ERROR_INVALID_VALUE;
      return Put(data, info.id);
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      return Put(data, 0u);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      if (info.device < 0)
        return vmm && info.mapped ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
      return Put(data, info.device);
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      // Only cuMemAlloc memory works with cuIpcGetMemHandle.
      return Put(data, static_cast<unsigned int>(info.kind == PointerInfo::kAlloc &&
                                                 !info.stream_ordered));
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      return Put(data, static_cast<CUdeviceptr>(info.base));
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      return Put(data, info.size);
    case CU_POINTER_ATTRIBUTE_MAPPED:
      return Put(data, static_cast<unsigned int>(!vmm || info.mapped));
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      // "ptr must be a pointer to memory obtained from cuMemAlloc()": driver
      // 580 on an H200 answers CUDA_SUCCESS there and CUDA_ERROR_INVALID_VALUE
      // for VMM memory. The tokens (for nv-p2p.h) mean nothing here.
      if (info.kind != PointerInfo::kAlloc || info.stream_ordered) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return Put(data, CUDA_POINTER_ATTRIBUTE_P2P_TOKENS{info.id, 1});
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// The contents of a CUipcMemHandle the fake hands out: which allocation.
struct IpcContents {
  char magic[8];
  uintptr_t base;
  unsigned long long id;
};
static_assert(sizeof(IpcContents) <= sizeof(CUipcMemHandle), "fits the handle");

}  // namespace
}  // namespace fakecuda

FAKECUDA_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                               CUdeviceptr ptr) {
  FAKECUDA_ENTER("cuPointerGetAttribute");
  uintptr_t p = static_cast<uintptr_t>(ptr);
  return Attribute(Describe(p), p, attribute, data);
}

FAKECUDA_EXPORT CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes,
                                                void** data, CUdeviceptr ptr) {
  FAKECUDA_ENTER("cuPointerGetAttributes");
  // No attributes is CUDA_ERROR_INVALID_VALUE, and so is P2P_TOKENS, which
  // this form's documentation does not list, whatever the pointer (driver
  // 580 on an H200; that the whole list is checked before any attribute is
  // written is assumed).
  if (count == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; ++i) {
    if (attributes[i] == CU_POINTER_ATTRIBUTE_P2P_TOKENS) return CUDA_ERROR_INVALID_VALUE;
  }
  uintptr_t p = static_cast<uintptr_t>(ptr);
  PointerInfo info = Describe(p);
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = Attribute(info, p, attributes[i], data[i]);
    // "Unlike cuPointerGetAttribute, this function will not return an error
    // when the ptr encountered is not a valid CUDA pointer. Instead, the
    // attributes are assigned default NULL values": so are attributes that
    // do not apply to this memory.
    if (r == CUDA_ERROR_INVALID_VALUE && AttributeSize(attributes[i]) != 0) {
      std::memset(data[i], 0, AttributeSize(attributes[i]));
    } else if (r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

// --- Interprocess handles ---------------------------------------------------------
// Only the export side: a single-process fake has no other process to open them.
FAKECUDA_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKECUDA_ENTER("cuIpcGetMemHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  // cuMemAlloc memory, not VMM or stream-ordered memory. The documentation
  // asks for "the base of an existing device memory allocation", but driver
  // 580 on an H200 gives a handle for a pointer 64 bytes into one too: the
  // handle names the allocation.
  const uintptr_t p = static_cast<uintptr_t>(dptr);
  auto a = Containing(m.allocations, p, AllocSize);
  if (a == m.allocations.end() || p >= a->first + a->second.size || a->second.stream_ordered) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcContents c{{'f', 'a', 'k', 'e', 'i', 'p', 'c', 0}, a->first, a->second.id};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &c, sizeof(c));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemExportToShareableHandle(void* shareable,
                                                      CUmemGenericAllocationHandle handle,
                                                      CUmemAllocationHandleType type,
                                                      unsigned long long flags) {
  FAKECUDA_ENTER("cuMemExportToShareableHandle");
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Memory& m = GetMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto* h = reinterpret_cast<Handle*>(handle);
  if (m.handles.count(h) == 0 || h->user_refs == 0) return CUDA_ERROR_INVALID_VALUE;
  // Only the handle types asked for at cuMemCreate can be exported.
  if ((h->prop.requestedHandleTypes & type) == 0 || (type & (type - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memcpy(shareable, &fd, sizeof(fd));
  return CUDA_SUCCESS;
}
