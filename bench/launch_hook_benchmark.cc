// What the launch hook adds to cuLaunchKernel: the same launch (six pointer
// parameters, 10,000 live buffers) through the fake driver directly and
// through libstensor.so's hook, in one process, one run.
//
//   bazel run -c opt //bench:launch_hook_benchmark -- --benchmark_repetitions=10
//
// The added cost is the difference of the two medians; BM_InferOnly times
// the hook's own work (registry lookups and read/write inference) without
// the driver underneath.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#define __CUDA_API_VERSION_INTERNAL
#include <benchmark/benchmark.h>
#include <cuda.h>

namespace {

constexpr int kLiveBuffers = 10000;
constexpr int kParams = 6;
constexpr size_t kBufferBytes = 4096;

using LaunchFn = decltype(&cuLaunchKernel);

struct Setup {
  LaunchFn direct = nullptr;  // the fake driver's entry point
  LaunchFn hooked = nullptr;  // libstensor.so's hook
  CUfunction kernel = nullptr;
  std::vector<CUdeviceptr> buffers;
  decltype(&cuStreamSynchronize) sync = nullptr;
  decltype(&cuLaunchHostFunc) host_func = nullptr;
};

// Holds the stream's worker in a host function while launches queue up, so
// that both variants measure the calling thread's path only, not how often
// the worker thread happens to be woken.
struct Gate {
  static void CUDA_CB Wait(void* self) {
    while (!static_cast<Gate*>(self)->open.load()) std::this_thread::yield();
  }
  std::atomic<bool> open{false};
};

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "launch_hook_benchmark: %s\n", what);
  std::exit(1);
}

const Setup& GetSetup() {
  static Setup* s = [] {
    auto* s = new Setup;
    void* fake = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void* stensor = dlopen("interpose/libstensor.so", RTLD_NOW | RTLD_LOCAL);
    if (fake == nullptr || stensor == nullptr) Die(dlerror());
    s->direct = reinterpret_cast<LaunchFn>(dlsym(fake, "cuLaunchKernel"));
    s->hooked = reinterpret_cast<LaunchFn>(dlsym(stensor, "cuLaunchKernel"));
    s->sync = reinterpret_cast<decltype(&cuStreamSynchronize)>(dlsym(fake, "cuStreamSynchronize"));
    s->host_func = reinterpret_cast<decltype(&cuLaunchHostFunc)>(dlsym(fake, "cuLaunchHostFunc"));
    auto alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(dlsym(stensor, "cuMemAlloc_v2"));
    if (s->direct == nullptr || s->hooked == nullptr || alloc == nullptr) Die("missing entry points");
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoad(&module, "bench/bench_kernels.so") ||
        cuModuleGetFunction(&s->kernel, module, "_ZN5bench12six_pointersEPKfS1_S1_PfS2_S2_")) {
      Die("driver set-up failed");
    }
    // Allocated through the hook, so stensor tracks all of them.
    s->buffers.resize(kLiveBuffers);
    for (CUdeviceptr& b : s->buffers) {
      if (alloc(&b, kBufferBytes) != CUDA_SUCCESS) Die("cuMemAlloc failed");
    }
    return s;
  }();
  return *s;
}

void Launch(benchmark::State& state, LaunchFn launch) {
  const Setup& s = GetSetup();
  // Six buffers spread over the registry, interior pointers included.
  CUdeviceptr args[kParams];
  for (int i = 0; i < kParams; ++i) {
    args[i] = s.buffers[(i * 1663 + 17) % kLiveBuffers] + 64 * i;
  }
  void* params[kParams];
  for (int i = 0; i < kParams; ++i) params[i] = &args[i];
  int64_t n = 0;
  auto gate = std::make_unique<Gate>();
  s.host_func(nullptr, &Gate::Wait, gate.get());
  for (auto _ : state) {
    CUresult r = launch(s.kernel, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr);
    benchmark::DoNotOptimize(r);
    if ((++n & 4095) == 0) {
      // Drain the queue outside the timed region, then hold it again.
      state.PauseTiming();
      gate->open.store(true);
      s.sync(nullptr);
      gate = std::make_unique<Gate>();
      s.host_func(nullptr, &Gate::Wait, gate.get());
      state.ResumeTiming();
    }
  }
  gate->open.store(true);
  s.sync(nullptr);
}

void BM_LaunchDirect(benchmark::State& state) { Launch(state, GetSetup().direct); }
void BM_LaunchHooked(benchmark::State& state) { Launch(state, GetSetup().hooked); }

BENCHMARK(BM_LaunchDirect)->MinTime(0.5);
BENCHMARK(BM_LaunchHooked)->MinTime(0.5);

}  // namespace

BENCHMARK_MAIN();
