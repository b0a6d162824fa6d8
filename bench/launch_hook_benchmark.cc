// What the launch hook adds to cuLaunchKernel: the same launch (six pointer
// parameters, 10,000 live buffers) through the fake driver directly and
// through libstensor.so's hook, in one process, one run.
//
//   bazel run -c opt //bench:launch_hook_benchmark -- --benchmark_repetitions=10
//
// The added cost is the difference of the two medians.
//
// With --count_launches=N (no benchmarks then) it makes N launches each way
// in two loops of their own, LaunchLoopDirect and LaunchLoopHooked, for
// callgrind to count the instructions of (scripts/bench.sh --instructions):
//
//   valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*LaunchLoop*'
//     launch_hook_benchmark --count_launches=N
//   callgrind_annotate --inclusive=yes callgrind.out.PID | grep LaunchLoop
//
// --new_words makes every launch's words differ from the last one's, so
// that the hook's memo of a kernel's last launch never applies; the
// *NewWords benchmarks time that case. --swappable makes the live buffers
// 1,000 of 2 MiB rather than 10,000 of 4 KiB, for the counts and the
// benchmarks alike: under a cap those are stensor's swappable buffers, each
// use of which keeps the eviction order and the planner's views current, as
// a training step's tensors are; the small ones are never swapped. (Under a
// cap of 1 GiB half of them go out as they are made: the cap binds, the
// launches' own six stay resident.) --rotate (with --count_launches) has
// launch i name buffers 6i .. 6i+5 of those 1,000 instead, so that under the
// same cap every launch moves buffers in and out: its count less the
// binding one, over the moves a launch it prints, is what a move costs.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#define __CUDA_API_VERSION_INTERNAL
#include <benchmark/benchmark.h>
#include <cuda.h>

namespace {

constexpr int kParams = 6;
// The live buffers: small ones, or (--swappable) large enough to be swapped.
int live_buffers = 10000;
size_t buffer_bytes = 4096;

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
    if (s->direct == nullptr || s->hooked == nullptr || alloc == nullptr)
      Die("missing entry points");
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoad(&module, "bench/bench_kernels.so") ||
        cuModuleGetFunction(&s->kernel, module, "_ZN5bench12six_pointersEPKfS1_S1_PfS2_S2_")) {
      Die("driver set-up failed");
    }
    // Allocated through the hook, so stensor tracks all of them.
    s->buffers.resize(live_buffers);
    for (CUdeviceptr& b : s->buffers) {
      if (alloc(&b, buffer_bytes) != CUDA_SUCCESS) Die("cuMemAlloc failed");
    }
    return s;
  }();
  return *s;
}

// The arguments of `sets` launches of the kernel: six buffers spread over
// the registry, interior pointers included; set j's words lie 8*j bytes
// further on, so that with sets > 1 each launch's words differ from the
// last one's (the hook's memo of a launch does not apply).
struct ArgSets {
  explicit ArgSets(const Setup& s, int sets, bool rotate = false)
      : args(sets), params(sets), ring(sets) {
    for (int j = 0; j < sets; ++j) {
      for (int i = 0; i < kParams; ++i) {
        args[j][i] = rotate ? s.buffers[(kParams * j + i) % s.buffers.size()]
                            : s.buffers[(i * 1663 + 17) % s.buffers.size()] + 64 * i + 8 * j;
        params[j][i] = &args[j][i];
      }
      ring[j] = params[j].data();
    }
  }
  std::vector<std::array<CUdeviceptr, kParams>> args;
  std::vector<std::array<void*, kParams>> params;
  std::vector<void**> ring;
};

// Sets in turn with --new_words (and in the *NewWords benchmarks).
constexpr int kNewWordSets = 24;

void Launch(benchmark::State& state, LaunchFn launch, int sets) {
  const Setup& s = GetSetup();
  ArgSets a(s, sets);
  int64_t n = 0;
  int set = 0;
  auto gate = std::make_unique<Gate>();
  s.host_func(nullptr, &Gate::Wait, gate.get());
  for (auto _ : state) {
    CUresult r = launch(s.kernel, 1, 1, 1, 128, 1, 1, 0, nullptr, a.ring[set], nullptr);
    benchmark::DoNotOptimize(r);
    if (++set == sets) set = 0;
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

void BM_LaunchDirect(benchmark::State& state) { Launch(state, GetSetup().direct, 1); }
void BM_LaunchHooked(benchmark::State& state) { Launch(state, GetSetup().hooked, 1); }
void BM_LaunchDirectNewWords(benchmark::State& state) {
  Launch(state, GetSetup().direct, kNewWordSets);
}
void BM_LaunchHookedNewWords(benchmark::State& state) {
  Launch(state, GetSetup().hooked, kNewWordSets);
}

BENCHMARK(BM_LaunchDirect)->MinTime(0.5);
BENCHMARK(BM_LaunchHooked)->MinTime(0.5);
BENCHMARK(BM_LaunchDirectNewWords)->MinTime(0.5);
BENCHMARK(BM_LaunchHookedNewWords)->MinTime(0.5);

// The launches alone, in functions of their own for callgrind to count:
// noipa keeps them out of line and keeps the compiler from folding the two
// identical bodies into one (callgrind tells them apart by name). The caller
// drains the queue outside them. Launch i takes params[i % sets].
__attribute__((always_inline)) inline void LaunchN(LaunchFn launch, CUfunction kernel,
                                                   void*** params, int sets, int n) {
  for (int i = 0; i < n; ++i) {
    if (launch(kernel, 1, 1, 1, 128, 1, 1, 0, nullptr, params[i % sets], nullptr) != CUDA_SUCCESS) {
      Die("cuLaunchKernel failed");
    }
  }
}
int loops_run[2];  // distinct side effects: the two bodies differ
__attribute__((noipa)) void LaunchLoopDirect(LaunchFn f, CUfunction k, void*** p, int sets, int n) {
  LaunchN(f, k, p, sets, n);
  ++loops_run[0];
}
__attribute__((noipa)) void LaunchLoopHooked(LaunchFn f, CUfunction k, void*** p, int sets, int n) {
  LaunchN(f, k, p, sets, n);
  ++loops_run[1];
}

// stensor's statistics (stensor_stats_json): the counter `key`, 0 when
// missing (no cap).
uint64_t StatsCounter(const char* key) {
  using StatsFn = size_t (*)(char*, size_t);
  static StatsFn stats = reinterpret_cast<StatsFn>(
      dlsym(dlopen("interpose/libstensor.so", RTLD_NOW | RTLD_NOLOAD), "stensor_stats_json"));
  if (stats == nullptr) return 0;
  std::vector<char> text(stats(nullptr, 0) + 1);
  stats(text.data(), text.size());
  const std::string quoted = std::string("\"") + key + "\":";
  const char* at = std::strstr(text.data(), quoted.c_str());
  return at == nullptr ? 0 : std::strtoull(at + quoted.size(), nullptr, 10);
}

// --count_launches=N: N launches through each loop, the same arguments as
// the benchmarks, a warm-up of each first: kernel descriptions, caches, and
// under a cap the stream's ring of completion marks, which grows once to its
// most (MemoryManager::kMaxMarksPerStream records, one per kDeferredRecords
// launches before the cap presses) while the device lags the host.
// With --new_words, each launch's six words differ from the last one's
// (interior pointers 8 bytes further on, 24 sets in turn): what a launch
// costs when the hook's memo of the last launch does not apply.
// With --rotate, launch i names the six buffers 6i .. 6i+5 (modulo the
// live ones): under a cap that holds half of them, each launch brings its
// six in and others go out; the moves a launch are printed, from stensor's
// statistics, so that the cost per move can be told from the cost a launch.
void CountLaunches(int n, bool new_words, bool rotate) {
  const Setup& s = GetSetup();
  const int sets = new_words ? kNewWordSets : rotate ? live_buffers / kParams : 1;
  ArgSets a(s, sets, rotate);
  std::vector<void**>& ring = a.ring;
  auto drain = [&] {
    if (s.sync(nullptr) != CUDA_SUCCESS) Die("cuStreamSynchronize failed");
  };
  auto warm_up = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      if (s.direct(s.kernel, 1, 1, 1, 128, 1, 1, 0, nullptr, ring[i % sets], nullptr) !=
              CUDA_SUCCESS ||
          s.hooked(s.kernel, 1, 1, 1, 128, 1, 1, 0, nullptr, ring[i % sets], nullptr) !=
              CUDA_SUCCESS) {
        Die("warm-up launch failed");
      }
    }
  };
  // In: copied, or not (overwritten whole, never written); out: copied or
  // dropped; served: reached in host memory.
  const char* const kIn[] = {"swap_ins", "swap_ins_without_copy", "swap_ins_never_written"};
  const char* const kOut[] = {"swap_outs_copied", "clean_drops", "never_written_drops"};
  auto count = [&](auto& keys) {
    uint64_t sum = 0;
    for (const char* key : keys) sum += StatsCounter(key);
    return sum;
  };
  // Rotating, each launch moves buffers (and the ring fills while the cap
  // binds): a few turns profile the planner's iteration. Where nothing moved
  // in those (no cap, or one that does not bind), as long a warm-up as the
  // others: the ring of marks grows and the records made before the cap
  // presses are applied (each buffer's first use on the stream noted) before
  // the count, not in it.
  auto moves = [&] { return count(kIn) + count(kOut) + StatsCounter("served_from_host"); };
  const int turns = rotate ? 4 * sets : 8192;
  const uint64_t moved = moves();
  warm_up(0, turns);
  if (moves() == moved) warm_up(turns, std::max(turns, 8192));
  drain();
  LaunchLoopDirect(s.direct, s.kernel, ring.data(), sets, n);
  drain();
  const uint64_t in = count(kIn), out = count(kOut), served = StatsCounter("served_from_host");
  LaunchLoopHooked(s.hooked, s.kernel, ring.data(), sets, n);
  drain();
  std::printf("launches per loop: %d\n", n);
  const double per_launch = 1.0 / n;
  std::printf("moves per launch: in %.3f out %.3f served %.3f\n", (count(kIn) - in) * per_launch,
              (count(kOut) - out) * per_launch,
              (StatsCounter("served_from_host") - served) * per_launch);
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kFlag[] = "--count_launches=";
  long count = 0;
  bool new_words = false, swappable = false, rotate = false;
  int kept = 1;  // arguments left for the benchmark library, ours taken out
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kFlag, sizeof(kFlag) - 1) == 0) {
      char* end = nullptr;
      count = std::strtol(argv[i] + sizeof(kFlag) - 1, &end, 10);
      if (*end != '\0' || count <= 0 || count > 10000000) {
        Die("--count_launches wants 1..10000000");
      }
    } else if (std::strcmp(argv[i], "--new_words") == 0) {
      new_words = true;
    } else if (std::strcmp(argv[i], "--swappable") == 0) {
      swappable = true;
    } else if (std::strcmp(argv[i], "--rotate") == 0) {
      rotate = swappable = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if ((new_words || rotate) && count == 0)
    Die("--new_words and --rotate go with --count_launches=N");
  if (new_words && rotate) Die("--new_words or --rotate, not both");
  if (swappable) {
    live_buffers = 1000;
    buffer_bytes = size_t{2} << 20;
  }
  if (count > 0) {
    CountLaunches(static_cast<int>(count), new_words, rotate);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
