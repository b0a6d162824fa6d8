// The exported hooks: one function per STENSOR_HOOK entry of
// core/driver/driver_symbols.inc, each with the exact ABI of the symbol it
// replaces. A hook only forwards: it hands the tracker the call's arguments
// and the real entry point, and returns what core/ answers. Every decision
// (whether stensor serves an allocation under a cap, what the cap is
// charged, which buffers must be resident, what a copy descriptor touches)
// is core's: core/tracker/tracker.h. Entry points that exist as a legacy
// and a per-thread-stream twin (_ptds/_ptsz) share one implementation.
#include <cstdint>
#include <vector>

#include "absl/base/attributes.h"
#include "core/inference/copy_ranges.h"
#include "interpose/state.h"

#define STENSOR_EXPORT extern "C" __attribute__((visibility("default")))

namespace stensor {
namespace {

Tracker& T() { return *State().tracker; }
const Driver& D() { return State().driver; }

constexpr CUresult kMissing = CUDA_ERROR_NOT_SUPPORTED;  // real entry absent

uint64_t Ptr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// --- Copies and memsets ---------------------------------------------------------
// What each touches is read from its arguments (core/inference/copy_ranges.h);
// the tracker does the rest (Tracker::Copy, Tracker::Memset).
template <typename Fn, typename... Args>
CUresult Copy(const char* api, CopyKind kind, Fn real, uint64_t dst, uint64_t src, uint64_t bytes,
              StreamRef s, bool async, Args... args) {
  return T().Copy(api, LinearCopyRanges(kind, dst, src, bytes), s, async, /*linear=*/true,
                  [&] { return real(args...); });
}

// 2D and 3D copies (plain and peer): made resident by their start
// addresses, logged as one copy of the whole region.
template <typename Fn, typename Params, typename... Args>
CUresult Region(const char* api, Fn real, const Params* p, StreamRef s, bool async, Args... args) {
  if (p == nullptr) return real(args...);  // the driver's error
  // A memory type the driver does not know: its error, before anything is
  // made resident or served from a host copy (a copy served so would
  // succeed where the driver refuses it).
  const CopyRanges c = CopyRangesOf(*p);
  if (c.src.memory == MemoryKind::kUnknown || c.dst.memory == MemoryKind::kUnknown) {
    CUresult r = T().exact_sizes().CheckUntypedCopy(p->srcDevice, p->dstDevice);
    return r != CUDA_SUCCESS ? r : real(args...);
  }
  return T().Copy(api, c, s, async, /*linear=*/false, [&] { return real(args...); });
}

// Calls `real` and, when it succeeded, `report()`.
template <typename Fn, typename Report, typename... Args>
CUresult CallThen(Fn real, Report&& report, Args... args) {
  CUresult r = real(args...);
  if (r == CUDA_SUCCESS) report();
  return r;
}

// Any memset form: `range` says what it sets (MemsetRangeOf).
template <typename Fn, typename... Args>
CUresult Memset(const char* api, Fn real, CUdeviceptr dst, MemsetRange range, StreamRef s,
                bool async, Args... args) {
  return T().Memset(api, dst, range, s, async, [&] { return real(dst, args...); });
}

// --- Launches -------------------------------------------------------------------
// Every launch form: accesses inferred (and, under a cap, made resident)
// before `call` submits it, recorded after.
template <typename Call>
CUresult LaunchWith(const char* api, CUfunction f, const unsigned grid[3], const unsigned block[3],
                    StreamRef stream, void** params, void** extra, Call&& call) {
  Accesses accesses;
  if (CUresult r = T().BeginLaunch(f, grid, block, stream, params, extra, &accesses);
      r != CUDA_SUCCESS) {
    return r;
  }
  CUresult r = call();
  T().EndLaunch(api, f, grid, block, stream, accesses, r == CUDA_SUCCESS);
  return r;
}

// Inlined into both exports: passing thirteen arguments on to one more
// call cost more than the copy of the code.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline CUresult Launch(const char* api,
                                                    decltype(&::cuLaunchKernel) real, CUfunction f,
                                                    unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz,
                                                    unsigned shmem, CUstream s, void** params,
                                                    void** extra, bool per_thread) {
  // LaunchWith spelled out: the most frequent hook, and a closure over its
  // eleven arguments cost more than the rest of the hook's own code.
  Tracker& t = T();
  const StreamRef stream{s, per_thread};
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  Accesses accesses;
  if (CUresult r = t.BeginLaunch(f, grid, block, stream, params, extra, &accesses);
      r != CUDA_SUCCESS) {
    return r;
  }
  CUresult r = real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  t.EndLaunch(api, f, grid, block, stream, accesses, r == CUDA_SUCCESS);
  return r;
}

CUresult LaunchEx(const char* api, decltype(&::cuLaunchKernelEx) real, const CUlaunchConfig* c,
                  CUfunction f, void** params, void** extra, bool per_thread) {
  if (c == nullptr) return real(c, f, params, extra);  // the driver's error
  const unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
  const unsigned block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
  return LaunchWith(api, f, grid, block, StreamRef{c->hStream, per_thread}, params, extra,
                    [&] { return real(c, f, params, extra); });
}

CUresult Cooperative(const char* api, decltype(&::cuLaunchCooperativeKernel) real, CUfunction f,
                     unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                     unsigned shmem, CUstream s, void** params, bool per_thread) {
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return LaunchWith(api, f, grid, block, StreamRef{s, per_thread}, params, nullptr,
                    [&] { return real(f, gx, gy, gz, bx, by, bz, shmem, s, params); });
}

template <typename Fn, typename... Args>
CUresult Sync(const char* api, Fn real, StreamRef s, Args... args) {
  CUresult r = real(args...);
  if (r == CUDA_SUCCESS) T().OnSync(api, s);
  return r;
}

// --- Graphs -----------------------------------------------------------------------
// Any instantiation form: `exec` and `graph` are its first two arguments;
// `flags` its instantiation flags.
template <typename Fn, typename... Args>
CUresult Instantiate(const char* api, Fn real, CUgraphExec* exec, CUgraph graph,
                     unsigned long long flags, Args... args) {
  CUresult r = real(args...);
  if (r == CUDA_SUCCESS && exec != nullptr) T().OnGraphInstantiate(api, *exec, graph, flags);
  return r;
}

// A capture is counted before the driver begins it, so that stensor's own
// calls on other threads are relaxed from the moment it may exist.
template <typename Fn, typename... Args>
CUresult BeginCapture(Fn real, StreamRef origin, Args... args) {
  T().OnCaptureBegin(origin);
  CUresult r = real(args...);
  if (r != CUDA_SUCCESS) T().OnCaptureEnd(origin);
  return r;
}

CUresult GraphLaunch(const char* api, decltype(&::cuGraphLaunch) real, CUgraphExec g, StreamRef s) {
  GraphLaunchScope scope;
  if (CUresult r = T().BeginGraphLaunch(g, s, &scope); r != CUDA_SUCCESS) return r;
  CUresult r = real(g, s.handle);
  T().EndGraphLaunch(api, g, s, scope, r == CUDA_SUCCESS);
  return r;
}

// A typed node setter: its parameters reported in cuGraphExecNodeSetParams's
// form once the driver took them.
template <typename Fn, typename Params, typename... Args>
CUresult NodeChanged(Fn real, CUgraphExec exec, CUgraphNode node, const Params* p, Args... args) {
  return CallThen(
      real,
      [&] {
        if (p) T().OnGraphExecNode(exec, node, NodeParams(*p));
      },
      args...);
}

// --- Module lifetime ------------------------------------------------------------
// The real unload runs inside an UnloadScope: from the moment the driver
// frees the handles it may hand them to another module's kernels.
template <typename Fn, typename Handle>
CUresult Unload(Fn real, Handle handle, CUmodule module) {
  KernelCache::UnloadScope scope(&T().kernels(), module);
  return real(handle);
}

// --- What the hooks below call that takes more than an expression -----------------
// `answer(&r)` answers for stensor's buffers (true, with the result in r;
// ExactSizes answers nothing uncapped); anything else is the driver's.
template <typename Fn, typename Answer, typename... Args>
CUresult OursOrDriver(Fn real, Answer&& answer, Args... args) {
  CUresult r;
  if (answer(&r)) return r;
  return real(args...);
}

// The capture ends whatever the driver answers (a failed end invalidates it).
CUresult EndCapture(decltype(&::cuStreamEndCapture) real, StreamRef origin, CUstream s,
                    CUgraph* g) {
  CUresult r = real(s, g);
  T().OnCaptureEnd(origin);
  return r;
}

}  // namespace
}  // namespace stensor

using namespace stensor;  // NOLINT: the exported C hooks below

// The entry-point list as names: a hook below of a symbol not listed as
// STENSOR_HOOK does not compile, and -Wl,-z,defs fails the link when a
// listed one has no hook, so the list and the exports are the same set.
namespace listed {
#define STENSOR_HOOK(name) constexpr bool name = true;
#define STENSOR_CALL(name)
#include "core/driver/driver_symbols.inc"
#undef STENSOR_HOOK
#undef STENSOR_CALL
}  // namespace listed

// Every export is one ONE or PAIR: the symbol, its parameters (the
// compiler holds them to cuda.h's declaration) and one expression, in which
// `kApi` names it, `real` is the real entry point of the same symbol and
// `kPerThread` says what stream handle 0 means. What takes more than an
// expression is a named function above or a tracker method, so the name of
// an entry point is written once.
#define HOOK(symbol, per_thread, params, ...) \
  STENSOR_EXPORT CUresult symbol params {     \
    static_assert(listed::symbol);            \
    constexpr bool kPerThread = per_thread;   \
    constexpr const char* kApi = #symbol;     \
    auto real = D().symbol;                   \
    if (real == nullptr) return kMissing;     \
    (void)kApi;                               \
    (void)kPerThread;                         \
    return __VA_ARGS__;                       \
  }
#define ONE(name, params, ...) HOOK(name, false, params, __VA_ARGS__)
// The legacy entry point and its per-thread-default-stream twin.
#define PAIR(name, twin, params, ...)    \
  HOOK(name, false, params, __VA_ARGS__) \
  HOOK(name##twin, true, params, __VA_ARGS__)

// --- Allocation and reporting ---------------------------------------------------
// Who answers each (stensor under a cap, or the driver), and what the cap
// is charged: core/tracker/tracker.h.
ONE(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes),
    T().Allocate(kApi, dptr, bytes, [&] { return real(dptr, bytes); }))
ONE(cuMemAllocPitch_v2,
    (CUdeviceptr * dptr, size_t* pitch, size_t width, size_t height, unsigned int element),
    T().AllocatePitch(kApi, dptr, pitch, width, height,
                      [&] { return real(dptr, pitch, width, height, element); }))
ONE(cuMemFree_v2, (CUdeviceptr dptr), T().Free(kApi, dptr, [&] { return real(dptr); }))
PAIR(cuMemAllocAsync, _ptsz, (CUdeviceptr * dptr, size_t bytes, CUstream s),
     T().AllocateAsync(kApi, dptr, bytes, StreamRef{s, kPerThread},
                       [&] { return real(dptr, bytes, s); }))
PAIR(cuMemAllocFromPoolAsync, _ptsz,
     (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream s),
     T().AllocateFromPool(kApi, dptr, bytes, [&] { return real(dptr, bytes, pool, s); }))
PAIR(cuMemFreeAsync, _ptsz, (CUdeviceptr dptr, CUstream s),
     T().FreeAsync(kApi, dptr, StreamRef{s, kPerThread}, [&] { return real(dptr, s); }))
ONE(cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value),
    CallThen(
        real, [&] { T().OnPoolGetAttribute(pool, attr, value); }, pool, attr, value))
ONE(cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value),
    CallThen(
        real, [&] { T().OnPoolSetAttribute(pool, attr); }, pool, attr, value))
ONE(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep),
    CallThen(
        real, [&] { T().OnPoolTrimTo(pool, keep); }, pool, keep))
ONE(cuMemGetInfo_v2, (size_t * free_bytes, size_t* total),
    CallThen(
        real, [&] { T().OnMemGetInfo(free_bytes, total); }, free_bytes, total))
ONE(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev),
    CallThen(
        real, [&] { T().OnDeviceTotalMem(dev, bytes); }, bytes, dev))
// Pinned host memory: counted, since it competes with the host store.
ONE(cuMemAllocHost_v2, (void** pp, size_t bytes),
    CallThen(
        real,
        [&] {
          if (pp) T().OnHostAlloc(kApi, *pp, bytes);
        },
        pp, bytes))
ONE(cuMemHostAlloc, (void** pp, size_t bytes, unsigned int flags),
    CallThen(
        real,
        [&] {
          if (pp) T().OnHostAlloc(kApi, *pp, bytes);
        },
        pp, bytes, flags))
ONE(cuMemFreeHost, (void* p),
    CallThen(
        real, [&] { T().OnHostFree(kApi, p); }, p))
// Registered memory: device work may write it, as pinned memory.
ONE(cuMemHostRegister_v2, (void* p, size_t bytes, unsigned int flags),
    CallThen(
        real, [&] { T().OnHostRegister(p, bytes); }, p, bytes, flags))
ONE(cuMemHostUnregister, (void* p),
    CallThen(
        real, [&] { T().OnHostUnregister(p); }, p))

// The application's own VMM mappings and physical memory.
ONE(cuMemMap,
    (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
     unsigned long long flags),
    CallThen(
        real, [&] { T().OnMap(kApi, ptr, size, handle); }, ptr, size, offset, handle, flags))
ONE(cuMemUnmap, (CUdeviceptr ptr, size_t size),
    CallThen(
        real, [&] { T().OnUnmap(kApi, ptr, size); }, ptr, size))
ONE(cuMemCreate,
    (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp* prop,
     unsigned long long flags),
    T().CreateMemory(handle, size, prop, flags, [&] { return real(handle, size, prop, flags); }))
ONE(cuMemRelease, (CUmemGenericAllocationHandle handle),
    CallThen(
        real, [&] { T().OnRelease(handle); }, handle))

// --- Exact sizes ------------------------------------------------------------------
// Under a cap a stensor buffer answers as the cuMemAlloc allocation asked
// for, resident or swapped out; anything else is the driver's answer.
ONE(cuMemGetAddressRange_v2, (CUdeviceptr * base, size_t* size, CUdeviceptr ptr),
    OursOrDriver(
        real, [&](CUresult* r) { return T().exact_sizes().AddressRange(ptr, base, size, r); }, base,
        size, ptr))
ONE(cuPointerGetAttribute, (void* data, CUpointer_attribute attribute, CUdeviceptr ptr),
    OursOrDriver(
        real,
        [&](CUresult* r) { return T().exact_sizes().PointerAttribute(data, attribute, ptr, r); },
        data, attribute, ptr))
ONE(cuPointerGetAttributes,
    (unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr),
    OursOrDriver(
        real,
        [&](CUresult* r) {
          return T().exact_sizes().PointerAttributes(count, attributes, data, ptr, r);
        },
        count, attributes, data, ptr))

// --- Handles that leave stensor's control ------------------------------------------
// For cuIpcGetMemHandle the driver's answer for VMM memory is
// CUDA_ERROR_INVALID_VALUE on a GPU: see docs/limits.md.
ONE(cuIpcGetMemHandle, (CUipcMemHandle * handle, CUdeviceptr ptr),
    T().GetIpcHandle(kApi, handle, ptr, [&] { return real(handle, ptr); }))
ONE(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle * handle, void* addr),
    T().RetainHandle(kApi, handle, addr, [&] { return real(handle, addr); }))
ONE(cuMemExportToShareableHandle,
    (void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
     unsigned long long flags),
    T().ExportHandle(kApi, handle, [&] { return real(shareable, handle, type, flags); }))

// --- Copies ---------------------------------------------------------------------
PAIR(cuMemcpy, _ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n),
     Copy(kApi, CopyKind::kDefault, real, dst, src, n, StreamRef{nullptr, kPerThread}, false, dst,
          src, n))
PAIR(cuMemcpyAsync, _ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
     Copy(kApi, CopyKind::kDefault, real, dst, src, n, StreamRef{s, kPerThread}, true, dst, src, n,
          s))
PAIR(cuMemcpyPeer, _ptds, (CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n),
     Copy(kApi, CopyKind::kPeer, real, dst, src, n, StreamRef{nullptr, kPerThread}, false, dst, dc,
          src, sc, n))
PAIR(cuMemcpyPeerAsync, _ptsz,
     (CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s),
     Copy(kApi, CopyKind::kPeer, real, dst, src, n, StreamRef{s, kPerThread}, true, dst, dc, src,
          sc, n, s))
PAIR(cuMemcpyHtoD_v2, _ptds, (CUdeviceptr dst, const void* src, size_t n),
     Copy(kApi, CopyKind::kHostToDevice, real, dst, Ptr(src), n, StreamRef{nullptr, kPerThread},
          false, dst, src, n))
PAIR(cuMemcpyDtoH_v2, _ptds, (void* dst, CUdeviceptr src, size_t n),
     Copy(kApi, CopyKind::kDeviceToHost, real, Ptr(dst), src, n, StreamRef{nullptr, kPerThread},
          false, dst, src, n))
PAIR(cuMemcpyDtoD_v2, _ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n),
     Copy(kApi, CopyKind::kDeviceToDevice, real, dst, src, n, StreamRef{nullptr, kPerThread}, false,
          dst, src, n))
PAIR(cuMemcpyHtoDAsync_v2, _ptsz, (CUdeviceptr dst, const void* src, size_t n, CUstream s),
     Copy(kApi, CopyKind::kHostToDevice, real, dst, Ptr(src), n, StreamRef{s, kPerThread}, true,
          dst, src, n, s))
PAIR(cuMemcpyDtoHAsync_v2, _ptsz, (void* dst, CUdeviceptr src, size_t n, CUstream s),
     Copy(kApi, CopyKind::kDeviceToHost, real, Ptr(dst), src, n, StreamRef{s, kPerThread}, true,
          dst, src, n, s))
PAIR(cuMemcpyDtoDAsync_v2, _ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
     Copy(kApi, CopyKind::kDeviceToDevice, real, dst, src, n, StreamRef{s, kPerThread}, true, dst,
          src, n, s))
PAIR(cuMemcpy2D_v2, _ptds, (const CUDA_MEMCPY2D* p),
     Region(kApi, real, p, StreamRef{nullptr, kPerThread}, false, p))
PAIR(cuMemcpy2DUnaligned_v2, _ptds, (const CUDA_MEMCPY2D* p),
     Region(kApi, real, p, StreamRef{nullptr, kPerThread}, false, p))
PAIR(cuMemcpy2DAsync_v2, _ptsz, (const CUDA_MEMCPY2D* p, CUstream s),
     Region(kApi, real, p, StreamRef{s, kPerThread}, true, p, s))
PAIR(cuMemcpy3D_v2, _ptds, (const CUDA_MEMCPY3D* p),
     Region(kApi, real, p, StreamRef{nullptr, kPerThread}, false, p))
PAIR(cuMemcpy3DAsync_v2, _ptsz, (const CUDA_MEMCPY3D* p, CUstream s),
     Region(kApi, real, p, StreamRef{s, kPerThread}, true, p, s))

namespace stensor {
namespace {

// A batch of copies: `ranges(i)` says what operation i touches; `valid`:
// the operations can be read (else the driver answers alone).
template <typename Fn, typename Ranges, typename... Args>
CUresult Batch(const char* api, Fn real, StreamRef s, size_t count, bool valid, Ranges&& ranges,
               Args... args) {
  std::vector<CopyRanges> ops;
  if (valid) {
    ops.reserve(count);
    for (size_t i = 0; i < count; ++i) ops.push_back(ranges(i));
  }
  return T().CopyBatch(api, ops, s, [&] { return real(args...); });
}
}  // namespace
}  // namespace stensor

PAIR(cuMemcpy3DPeer, _ptds, (const CUDA_MEMCPY3D_PEER* p),
     Region(kApi, real, p, StreamRef{nullptr, kPerThread}, false, p))
PAIR(cuMemcpy3DPeerAsync, _ptsz, (const CUDA_MEMCPY3D_PEER* p, CUstream s),
     Region(kApi, real, p, StreamRef{s, kPerThread}, true, p, s))
PAIR(cuMemcpyBatchAsync_v2, _ptsz,
     (CUdeviceptr * dsts, CUdeviceptr* srcs, size_t* sizes, size_t count, CUmemcpyAttributes* attrs,
      size_t* attrs_idxs, size_t num_attrs, CUstream s),
     Batch(
         kApi, real, StreamRef{s, kPerThread}, count, dsts != nullptr && srcs != nullptr,
         [&](size_t i) {
           return LinearCopyRanges(CopyKind::kDefault, dsts[i], srcs[i],
                                   sizes != nullptr ? sizes[i] : 0);
         },
         dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, s))
PAIR(cuMemcpy3DBatchAsync_v2, _ptsz,
     (size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, CUstream s),
     Batch(
         kApi, real, StreamRef{s, kPerThread}, num_ops, ops != nullptr,
         [&](size_t i) { return CopyRangesOf(ops[i]); }, num_ops, ops, flags, s))
PAIR(cuMemcpyDtoA_v2, _ptds, (CUarray dst, size_t offset, CUdeviceptr src, size_t n),
     Copy(kApi, CopyKind::kDeviceToArray, real, 0, src, n, StreamRef{nullptr, kPerThread}, false,
          dst, offset, src, n))
PAIR(cuMemcpyAtoD_v2, _ptds, (CUdeviceptr dst, CUarray src, size_t offset, size_t n),
     Copy(kApi, CopyKind::kArrayToDevice, real, dst, 0, n, StreamRef{nullptr, kPerThread}, false,
          dst, src, offset, n))

// --- Memsets --------------------------------------------------------------------
PAIR(cuMemsetD8_v2, _ptds, (CUdeviceptr d, unsigned char v, size_t n),
     Memset(kApi, real, d, MemsetRangeOf(1, n, 1, 0), StreamRef{nullptr, kPerThread}, false, v, n))
PAIR(cuMemsetD16_v2, _ptds, (CUdeviceptr d, unsigned short v, size_t n),
     Memset(kApi, real, d, MemsetRangeOf(2, n, 1, 0), StreamRef{nullptr, kPerThread}, false, v, n))
PAIR(cuMemsetD32_v2, _ptds, (CUdeviceptr d, unsigned int v, size_t n),
     Memset(kApi, real, d, MemsetRangeOf(4, n, 1, 0), StreamRef{nullptr, kPerThread}, false, v, n))
PAIR(cuMemsetD2D8_v2, _ptds, (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h),
     Memset(kApi, real, d, MemsetRangeOf(1, w, h, pitch), StreamRef{nullptr, kPerThread}, false,
            pitch, v, w, h))
PAIR(cuMemsetD2D16_v2, _ptds, (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h),
     Memset(kApi, real, d, MemsetRangeOf(2, w, h, pitch), StreamRef{nullptr, kPerThread}, false,
            pitch, v, w, h))
PAIR(cuMemsetD2D32_v2, _ptds, (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h),
     Memset(kApi, real, d, MemsetRangeOf(4, w, h, pitch), StreamRef{nullptr, kPerThread}, false,
            pitch, v, w, h))
PAIR(cuMemsetD8Async, _ptsz, (CUdeviceptr d, unsigned char v, size_t n, CUstream s),
     Memset(kApi, real, d, MemsetRangeOf(1, n, 1, 0), StreamRef{s, kPerThread}, true, v, n, s))
PAIR(cuMemsetD16Async, _ptsz, (CUdeviceptr d, unsigned short v, size_t n, CUstream s),
     Memset(kApi, real, d, MemsetRangeOf(2, n, 1, 0), StreamRef{s, kPerThread}, true, v, n, s))
PAIR(cuMemsetD32Async, _ptsz, (CUdeviceptr d, unsigned int v, size_t n, CUstream s),
     Memset(kApi, real, d, MemsetRangeOf(4, n, 1, 0), StreamRef{s, kPerThread}, true, v, n, s))
PAIR(cuMemsetD2D8Async, _ptsz,
     (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s),
     Memset(kApi, real, d, MemsetRangeOf(1, w, h, pitch), StreamRef{s, kPerThread}, true, pitch, v,
            w, h, s))
PAIR(cuMemsetD2D16Async, _ptsz,
     (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s),
     Memset(kApi, real, d, MemsetRangeOf(2, w, h, pitch), StreamRef{s, kPerThread}, true, pitch, v,
            w, h, s))
PAIR(cuMemsetD2D32Async, _ptsz,
     (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s),
     Memset(kApi, real, d, MemsetRangeOf(4, w, h, pitch), StreamRef{s, kPerThread}, true, pitch, v,
            w, h, s))

// --- Launches -------------------------------------------------------------------
PAIR(cuLaunchKernel, _ptsz,
     (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
      unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params,
      void** extra),
     Launch(kApi, real, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra, kPerThread))
PAIR(cuLaunchKernelEx, _ptsz,
     (const CUlaunchConfig* config, CUfunction f, void** params, void** extra),
     LaunchEx(kApi, real, config, f, params, extra, kPerThread))
PAIR(cuLaunchCooperativeKernel, _ptsz,
     (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
      unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params),
     Cooperative(kApi, real, f, gx, gy, gz, bx, by, bz, shmem, s, params, kPerThread))
// --- Graphs and stream capture --------------------------------------------------
// A launch makes every node's buffers resident first (core/inference/graph_plan.h).
PAIR(cuGraphLaunch, _ptsz, (CUgraphExec g, CUstream s),
     GraphLaunch(kApi, real, g, StreamRef{s, kPerThread}))
// Instantiation reads the graph's nodes; every form.
ONE(cuGraphInstantiate,
    (CUgraphExec * exec, CUgraph g, CUgraphNode* error_node, char* log, size_t log_size),
    Instantiate(kApi, real, exec, g, 0, exec, g, error_node, log, log_size))
ONE(cuGraphInstantiate_v2,
    (CUgraphExec * exec, CUgraph g, CUgraphNode* error_node, char* log, size_t log_size),
    Instantiate(kApi, real, exec, g, 0, exec, g, error_node, log, log_size))
ONE(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph g, unsigned long long flags),
    Instantiate(kApi, real, exec, g, flags, exec, g, flags))
PAIR(cuGraphInstantiateWithParams, _ptsz,
     (CUgraphExec * exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* params),
     Instantiate(kApi, real, exec, g, params != nullptr ? params->flags : 0, exec, g, params))
// Forgotten first: the driver may hand the handle to another thread's
// instantiation as soon as it is destroyed.
ONE(cuGraphExecDestroy, (CUgraphExec exec), (T().OnGraphExecDestroy(exec), real(exec)))
// A child graph node given another graph: the exec's accesses become unknown.
ONE(cuGraphExecChildGraphNodeSetParams, (CUgraphExec exec, CUgraphNode node, CUgraph child),
    CallThen(
        real, [&] { T().OnGraphExecChildChanged(exec); }, exec, node, child))
// Node parameters changed in an exec: that node's accesses are read again.
ONE(cuGraphExecKernelNodeSetParams,
    (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* p),
    NodeChanged(real, exec, node, p, exec, node, p))
ONE(cuGraphExecKernelNodeSetParams_v2,
    (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* p),
    NodeChanged(real, exec, node, p, exec, node, p))
ONE(cuGraphExecMemcpyNodeSetParams,
    (CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D* p, CUcontext ctx),
    NodeChanged(real, exec, node, p, exec, node, p, ctx))
ONE(cuGraphExecMemsetNodeSetParams,
    (CUgraphExec exec, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx),
    NodeChanged(real, exec, node, p, exec, node, p, ctx))
ONE(cuGraphExecNodeSetParams, (CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* p),
    CallThen(
        real,
        [&] {
          if (p) T().OnGraphExecNode(exec, node, *p);
        },
        exec, node, p))
// The exec now runs another graph's nodes.
ONE(cuGraphExecUpdate,
    (CUgraphExec exec, CUgraph g, CUgraphNode* error_node, CUgraphExecUpdateResult* result),
    CallThen(
        real, [&] { T().OnGraphExecUpdate(exec, g); }, exec, g, error_node, result))
ONE(cuGraphExecUpdate_v2, (CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo* info),
    CallThen(
        real, [&] { T().OnGraphExecUpdate(exec, g); }, exec, g, info))
// Captures begun and ended: while any is in progress, work is asked about.
PAIR(cuStreamBeginCapture, _ptsz, (CUstream s), BeginCapture(real, StreamRef{s, kPerThread}, s))
PAIR(cuStreamBeginCapture_v2, _ptsz, (CUstream s, CUstreamCaptureMode mode),
     BeginCapture(real, StreamRef{s, kPerThread}, s, mode))
PAIR(cuStreamBeginCaptureToGraph, _ptsz,
     (CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data, size_t n,
      CUstreamCaptureMode mode),
     BeginCapture(real, StreamRef{s, kPerThread}, s, g, deps, data, n, mode))
PAIR(cuStreamEndCapture, _ptsz, (CUstream s, CUgraph* g),
     EndCapture(real, StreamRef{s, kPerThread}, s, g))

// --- Synchronisation ------------------------------------------------------------
ONE(cuCtxSynchronize, (void), Sync(kApi, real, StreamRef{}))
ONE(cuCtxSynchronize_v2, (CUcontext ctx), Sync(kApi, real, StreamRef{}, ctx))
PAIR(cuStreamSynchronize, _ptsz, (CUstream s), Sync(kApi, real, StreamRef{s, kPerThread}, s))
ONE(cuEventSynchronize, (CUevent e), Sync(kApi, real, StreamRef{}, e))
// Records mark points in a stream; logged as synchronisation points.
PAIR(cuEventRecord, _ptsz, (CUevent e, CUstream s),
     Sync(kApi, real, StreamRef{s, kPerThread}, e, s))
PAIR(cuEventRecordWithFlags, _ptsz, (CUevent e, CUstream s, unsigned int flags),
     Sync(kApi, real, StreamRef{s, kPerThread}, e, s, flags))
PAIR(cuStreamWaitEvent, _ptsz, (CUstream s, CUevent e, unsigned int flags),
     Sync(kApi, real, StreamRef{s, kPerThread}, s, e, flags))
// Host functions and callbacks run in stream order and may write any host
// memory, a later upload's source among it (Tracker::OnHostFunction).
PAIR(cuLaunchHostFunc, _ptsz, (CUstream s, CUhostFn fn, void* data),
     CallThen(
         real,
         [&] {
           T().OnHostFunction(StreamRef{s, kPerThread});
         },
         s, fn, data))
PAIR(cuStreamAddCallback, _ptsz,
     (CUstream s, CUstreamCallback callback, void* data, unsigned int flags),
     CallThen(
         real,
         [&] {
           T().OnHostFunction(StreamRef{s, kPerThread});
         },
         s, callback, data, flags))

// --- Contexts that end --------------------------------------------------------
// stensor's streams and events in the context are retired around the call.
ONE(cuCtxDestroy_v2, (CUcontext ctx), T().DestroyContext(ctx, [&] { return real(ctx); }))
ONE(cuDevicePrimaryCtxReset_v2, (CUdevice dev),
    T().EndPrimaryContext(dev, /*reset=*/true, [&] { return real(dev); }))
ONE(cuDevicePrimaryCtxRelease_v2, (CUdevice dev),
    T().EndPrimaryContext(dev, /*reset=*/false, [&] { return real(dev); }))

// --- Module lifetime ------------------------------------------------------------
ONE(cuModuleUnload, (CUmodule m), Unload(real, m, m))
// Which functions a library's kernels became is not asked: all are forgotten.
ONE(cuLibraryUnload, (CUlibrary l), Unload(real, l, /*module=*/nullptr))
