// Programs that hand stensor handles it must not take at face value, run
// with and without stensor (and under a cap): each prints the results the
// driver gave it and a checksum of its buffers, which must be the same
// either way.
//   handle_adversary KERNELS_SO free-async
//     cuMemFreeAsync and cuMemAllocAsync on a destroyed stream and on a
//     handle that never was one: the driver's CUDA_ERROR_INVALID_HANDLE, and
//     the buffers keep their data (they are then swapped out and back).
//   handle_adversary KERNELS_SO refused-work
//     the same, and then a copy, a memset and a launch on such streams
//     into the swapped-out buffers: refused, nothing of them shows.
//   handle_adversary KERNELS_SO graph-update
//     an exec updated from another graph (cuGraphExecUpdate), then one of
//     its kernel nodes given new arguments through the ORIGINAL graph's
//     node handle (the handles an exec's nodes keep): launched between
//     direct launches that swap its buffers out.
//   handle_adversary KERNELS_SO ctx-destroy | ctx-reset | ctx-release
//     buffers made, swapped and freed in one context, which is then
//     destroyed (cuCtxDestroy), reset (cuDevicePrimaryCtxReset) or released
//     for good (cuDevicePrimaryCtxRelease); then, in a live context, more
//     buffers than the cap holds, each written and read back.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kWords = 512 * 1024;
constexpr size_t kBytes = kWords * 4;  // one 2 MiB granule
CUfunction g_mix;

// The driver's answer, by name, for the output (compared with the plain run).
void Say(const char* what, CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::printf("%s: %s\n", what, name != nullptr ? name : "?");
}

std::vector<uint32_t> Pattern(uint32_t seed) {
  std::vector<uint32_t> v(kWords);
  for (size_t i = 0; i < kWords; ++i) v[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  return v;
}

void Fill(CUdeviceptr p, uint32_t seed) {
  std::vector<uint32_t> v = Pattern(seed);
  CHECK(cuMemcpyHtoD(p, v.data(), kBytes));
}

CUdeviceptr NewBuffer(uint32_t seed) {
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, kBytes));
  Fill(p, seed);
  return p;
}

void Mix(CUdeviceptr x, CUdeviceptr y, uint32_t a, CUstream s) {
  int64_t n = kWords;
  void* args[] = {&x, &y, &a, &n};
  CHECK(cuLaunchKernel(g_mix, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

// Eight more buffers used round and round: under a cap of eight buffers or
// less, every other buffer becomes the oldest and is swapped out.
void Churn(const std::vector<CUdeviceptr>& f, CUstream s) {
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < f.size(); ++i) Mix(f[i], f[(i + 1) % f.size()], 7, s);
  }
  CHECK(cuStreamSynchronize(s));
}

uint64_t Checksum(const std::vector<CUdeviceptr>& buffers) {
  uint64_t h = 1469598103934665603ull;
  std::vector<uint32_t> v(kWords);
  for (CUdeviceptr p : buffers) {
    CHECK(cuMemcpyDtoH(v.data(), p, kBytes));
    for (uint32_t w : v) h = (h ^ w) * 1099511628211ull;
  }
  return h;
}

std::vector<CUdeviceptr> Buffers(int n, uint32_t seed) {
  std::vector<CUdeviceptr> f;
  for (int i = 0; i < n; ++i) f.push_back(NewBuffer(seed + i));
  return f;
}

void FreeAll(const std::vector<CUdeviceptr>& f) {
  for (CUdeviceptr p : f) CHECK(cuMemFree(p));
}

uint64_t FreeAsync(bool refused_work) {
  CUstream s, gone;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&gone, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamDestroy(gone));
  // Never a stream: a live stream's handle plus one (an odd address no
  // stream object has).
  CUstream bogus = reinterpret_cast<CUstream>(reinterpret_cast<uintptr_t>(s) + 1);
  CUdeviceptr a, b;
  CHECK(cuMemAllocAsync(&a, kBytes, s));  // stream-ordered (served by stensor under a cap)
  b = NewBuffer(2);                       // cuMemAlloc
  std::vector<uint32_t> v = Pattern(1);
  CHECK(cuMemcpyHtoDAsync(a, v.data(), kBytes, s));
  CHECK(cuStreamSynchronize(s));
  Say("free-async destroyed stream", cuMemFreeAsync(a, gone));
  Say("free-async bogus stream", cuMemFreeAsync(a, bogus));
  Say("free-async cuMemAlloc buffer, destroyed stream", cuMemFreeAsync(b, gone));
  Say("free-async cuMemAlloc buffer, bogus stream", cuMemFreeAsync(b, bogus));
  CUdeviceptr c = 0;
  Say("alloc-async destroyed stream", cuMemAllocAsync(&c, kBytes, gone));
  Say("alloc-async bogus stream", cuMemAllocAsync(&c, kBytes, bogus));
  std::vector<CUdeviceptr> f = Buffers(8, 10);
  Churn(f, s);  // a and b swapped out under the cap, and back for the checksum
  if (refused_work) {
    // Work on them the driver refuses: nothing of it may show.
    std::vector<uint32_t> zeros(kWords, 0);
    Say("whole copy, bogus stream", cuMemcpyHtoDAsync(a, zeros.data(), kBytes, bogus));
    Say("memset, destroyed stream", cuMemsetD32Async(b, 0, kWords, gone));
    uint32_t k = 1;
    int64_t n = kWords;
    void* args[] = {&a, &b, &k, &n};
    Say("launch, bogus stream", cuLaunchKernel(g_mix, 1, 1, 1, 1, 1, 1, 0, bogus, args, nullptr));
    Churn(f, s);
  }
  const uint64_t h = Checksum({a, b});
  Say("free-async", cuMemFreeAsync(a, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemFree(b));
  FreeAll(f);
  return h;
}

uint64_t GraphUpdate() {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<CUdeviceptr> x = Buffers(3, 1), y = Buffers(3, 4), f = Buffers(8, 10);
  // Two graphs of one shape: mix(x0, y0) -> mix(x1, y1), and the same on
  // other buffers.
  CUgraph g[2];
  for (int k = 0; k < 2; ++k) {
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    Mix(x[k], y[k], 3, s);
    Mix(y[k], x[k], 5, s);
    CHECK(cuStreamEndCapture(s, &g[k]));
  }
  CUgraphExec e;
  CHECK(cuGraphInstantiateWithFlags(&e, g[0], 0));
  CHECK(cuGraphLaunch(e, s));
  CUgraphExecUpdateResultInfo info{};
  CHECK(cuGraphExecUpdate(e, g[1], &info));
  CHECK(cuGraphLaunch(e, s));
  // The original graph's second node now reads and writes the third pair.
  CUgraphNode nodes[2];
  size_t count = 2;
  CHECK(cuGraphGetNodes(g[0], nodes, &count));
  CUgraphNode second = nodes[1];
  CUDA_KERNEL_NODE_PARAMS p{};
  CHECK(cuGraphKernelNodeGetParams(second, &p));
  uint32_t a = 9;
  int64_t n = kWords;
  void* args[] = {&y[2], &x[2], &a, &n};
  p.kernelParams = args;
  Say("exec node set through the original graph's node",
      cuGraphExecKernelNodeSetParams(e, second, &p));
  for (int step = 0; step < 3; ++step) {
    Churn(f, s);  // every buffer of the graph swapped out under the cap
    Say("graph launch", cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
  }
  CHECK(cuGraphExecDestroy(e));
  for (CUgraph one : g) CHECK(cuGraphDestroy(one));
  std::vector<CUdeviceptr> all = x;
  all.insert(all.end(), y.begin(), y.end());
  const uint64_t h = Checksum(all);
  FreeAll(x);
  FreeAll(y);
  FreeAll(f);
  return h;
}

// Buffers made, swapped and freed with `ctx` current; then `end` ends it.
// Then, with device 0's primary context current, twelve buffers under a cap
// of eight: each allocation past the eighth needs an eviction.
template <typename End>
uint64_t ContextEnds(CUdevice dev, CUcontext ctx, End&& end) {
  CHECK(cuCtxSetCurrent(ctx));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<CUdeviceptr> first = Buffers(10, 100);
  Churn(first, s);  // swapped out and in on stensor's streams, made in `ctx`
  FreeAll(first);
  CHECK(cuStreamDestroy(s));
  Say("context ended", end());
  CUcontext primary;
  CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
  CHECK(cuCtxSetCurrent(primary));
  std::vector<CUdeviceptr> later;
  for (uint32_t i = 0; i < 12; ++i) {
    CUdeviceptr p = 0;
    Say("allocation after the end", cuMemAlloc(&p, kBytes));
    Fill(p, 200 + i);
    later.push_back(p);
  }
  std::vector<uint32_t> v(kWords);
  for (uint32_t i = 0; i < later.size(); ++i) {
    CHECK(cuMemcpyDtoH(v.data(), later[i], kBytes));
    EXPECT_TRUE(v == Pattern(200 + i));
  }
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Churn(later, s);
  const uint64_t h = Checksum(later);
  FreeAll(later);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[2] : "";
  if (mode != "free-async" && mode != "refused-work" && mode != "graph-update" &&
      mode != "ctx-destroy" && mode != "ctx-reset" && mode != "ctx-release") {
    std::fprintf(stderr,
                 "usage: handle_adversary KERNELS_SO "
                 "free-async|refused-work|graph-update|ctx-destroy|ctx-reset|ctx-release\n");
    return 2;
  }
  CUdevice dev = stensor_tests::StartOnDevice0();
  CUmodule m;
  CHECK(cuModuleLoad(&m, argv[1]));
  CHECK(cuModuleGetFunction(&g_mix, m, "_ZN6stress3mixEPKjPjjl"));
  uint64_t h = 0;
  if (mode == "free-async" || mode == "refused-work") {
    h = FreeAsync(mode == "refused-work");
  } else if (mode == "graph-update") {
    h = GraphUpdate();
  } else if (mode == "ctx-destroy") {
    CUcontext created;
    CHECK(cuCtxCreate(&created, nullptr, 0, dev));
    h = ContextEnds(dev, created, [&] { return cuCtxDestroy(created); });
  } else {
    // The primary context, retained once more by this program: a reset
    // ends it whatever its count, a release only with the last reference.
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    h = ContextEnds(dev, primary, [&] {
      if (mode == "ctx-reset") return cuDevicePrimaryCtxReset(dev);
      CHECK(cuDevicePrimaryCtxRelease(dev));
      return cuDevicePrimaryCtxRelease(dev);
    });
  }
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  return stensor_tests::failures == 0 ? 0 : 1;
}
