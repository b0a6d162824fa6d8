// The launch hook's own work without a driver underneath: read/write
// inference for a launch with six pointer parameters against 10,000 live
// buffers, and its parts.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "core/inference/buffer_registry.h"
#include "core/inference/launch_inference.h"

namespace stensor {
namespace {

constexpr int kLiveBuffers = 10000;

struct Fixture {
  BufferRegistry registry;
  KernelInfo kernel;
  uint64_t args[6];
  void* params[6];
  Fixture() {
    for (int i = 0; i < kLiveBuffers; ++i) {
      registry.Add(0x7f0000000000ull + uint64_t(i) * 8192, 4096, 0, BufferKind::kDeviceAlloc);
    }
    kernel.layout_known = true;
    for (uint32_t i = 0; i < 6; ++i) {
      kernel.params.push_back(
          ParamSlot{8 * i, 8, i < 3 ? ParamAccess::kRead : ParamAccess::kReadWrite, 0, 1});
      args[i] = 0x7f0000000000ull + uint64_t((i * 1663 + 17) % kLiveBuffers) * 8192 + 64 * i;
      params[i] = &args[i];
    }
    kernel.args_size = 48;
    IndexProbes(&kernel);
  }
};

Fixture& F() {
  static Fixture* f = new Fixture;
  return *f;
}

void BM_Infer(benchmark::State& state) {
  Fixture& f = F();
  for (auto _ : state) {
    Accesses a;
    InferLaunchAccesses(f.kernel, f.params, nullptr, f.registry, &a);
    benchmark::DoNotOptimize(a);
  }
}
BENCHMARK(BM_Infer);

void BM_FindOne(benchmark::State& state) {
  Fixture& f = F();
  uint64_t i = 0;
  for (auto _ : state) {
    auto b = f.registry.Find(f.args[i++ % 6]);
    benchmark::DoNotOptimize(b);
  }
}
BENCHMARK(BM_FindOne);

}  // namespace
}  // namespace stensor

BENCHMARK_MAIN();
