// The fast path of MemoryManager under a cap: Prepare + Finish of an
// operation on four resident buffers (two of them written), as the tracker
// wraps every launch, copy and memset. No swapping happens; this is what a
// cap costs a launch whose buffers are all on the device. One of the four
// was swapped in once, so the copy it came back with is waited for once and
// then known complete.
//
// BM_EvictOne/n: one eviction and one swap-in per iteration among n
// resident buffers (the cap full), buffers used in a cycle so that the least
// recently used one goes each time. Nothing is copied (never-written
// buffers, overwritten whole when they come back; no host-located VMM, so no
// host copy either) and the device memory comes from the pool, so what
// grows with n is the cost of choosing the buffer to evict: flat when that
// is O(log n). (n stops at 15,000: the fake holds a memfd per physical
// handle, and this machine allows 20,000 open files.)
//
//   bazel run -c opt //bench:memory_manager_benchmark -- --benchmark_repetitions=10
#ifndef __CUDA_API_VERSION_INTERNAL  // core:driver defines it for its dependents
#define __CUDA_API_VERSION_INTERNAL
#endif
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/base/config.h"
#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "memory_manager_benchmark: %s\n", what);
  std::exit(1);
}

// Holds a stream's worker while operations queue up, so the benchmark
// measures the calling thread's path only.
struct Gate {
  static void CUDA_CB Wait(void* self) {
    while (!static_cast<Gate*>(self)->open.load()) std::this_thread::yield();
  }
  std::atomic<bool> open{false};
};

void BM_PrepareFinishResident(benchmark::State& state) {
  if (cuInit(0) != CUDA_SUCCESS) Die("cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    Die("context");
  }
  static stensor::Driver driver;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr || stensor::LoadDriver(handle, &dlsym, &driver) == 0) Die("driver");
  std::map<std::string, std::string> env = {{"STENSOR_MEMORY_LIMIT", "64MiB"}};
  auto config = stensor::Config::Parse([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  if (!config.ok()) Die("config");
  auto mm = stensor::MemoryManager::Create(*config, &driver, nullptr);
  std::vector<CUdeviceptr> ptrs;
  for (uint64_t id = 1; id <= 32; ++id) {  // 64 MiB: the cap is full
    CUdeviceptr p = 0;
    if (mm->Allocate(2 << 20, &p, [id](CUdeviceptr) { return id; }) != CUDA_SUCCESS) {
      Die("Allocate");
    }
    ptrs.push_back(p);
  }
  std::vector<uint64_t> first = {1};
  mm->Finish(first, first, nullptr, true);  // written
  CUdeviceptr extra = 0;                    // swaps buffer 1 out
  if (mm->Allocate(2 << 20, &extra, [](CUdeviceptr) { return uint64_t{100}; }) != CUDA_SUCCESS) {
    Die("Allocate");
  }
  cuCtxSynchronize();
  std::vector<uint64_t> ids = {1, 2, 3, 4}, written = {2, 3};
  if (mm->Prepare(ids, {}, nullptr) != CUDA_SUCCESS) Die("Prepare");  // swaps 1 in
  mm->Finish(ids, written, nullptr, true);
  cuCtxSynchronize();
  CUstream stream = nullptr;
  if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) Die("stream");
  Gate gate;
  cuLaunchHostFunc(stream, &Gate::Wait, &gate);
  for (auto _ : state) {
    if (mm->Prepare(ids, {}, stream) != CUDA_SUCCESS) Die("Prepare");
    mm->Finish(ids, written, stream, true);
  }
  gate.open.store(true);
  cuStreamSynchronize(stream);
  cuStreamDestroy(stream);
  mm.reset();
}
BENCHMARK(BM_PrepareFinishResident)->MinTime(0.5);

void BM_EvictOne(benchmark::State& state) {
  if (cuInit(0) != CUDA_SUCCESS) Die("cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    Die("context");
  }
  static stensor::Driver driver;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr || stensor::LoadDriver(handle, &dlsym, &driver) == 0) Die("driver");
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  constexpr uint64_t kGranule = 2 << 20;
  std::map<std::string, std::string> env = {{"STENSOR_MEMORY_LIMIT", std::to_string(n * kGranule)}};
  auto config = stensor::Config::Parse([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  if (!config.ok()) Die("config");
  auto mm = stensor::MemoryManager::Create(*config, &driver, nullptr);
  std::vector<CUdeviceptr> ptrs;
  for (uint64_t id = 1; id <= n + 1; ++id) {  // one more than fits
    CUdeviceptr p = 0;
    if (mm->Allocate(kGranule, &p, [id](CUdeviceptr) { return id; }) != CUDA_SUCCESS) {
      Die("Allocate");
    }
    ptrs.push_back(p);
  }
  cuCtxSynchronize();
  uint64_t next = 1;  // swapped out by the allocation of n + 1
  for (auto _ : state) {
    const uint64_t ids[] = {next};
    if (mm->Prepare(ids, ids, nullptr) != CUDA_SUCCESS) Die("Prepare");
    mm->Finish(ids, {}, nullptr, true);
    next = next % (n + 1) + 1;
  }
  state.counters["buffers"] = static_cast<double>(n);
  cuCtxSynchronize();
  for (CUdeviceptr p : ptrs) mm->Free(p);
  mm.reset();
}
BENCHMARK(BM_EvictOne)->Arg(1000)->Arg(5000)->Arg(15000)->Iterations(3000);

}  // namespace

int main(int argc, char** argv) {
  // Room for 15,000 granules on the fake; no host-located VMM (so nothing
  // makes host copies of never-written buffers). Set before the fake starts.
  setenv("FAKECUDA_DEVICE_MEMORY", "64GiB", /*overwrite=*/0);
  setenv("FAKECUDA_HOST_VMM", "0", /*overwrite=*/0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
