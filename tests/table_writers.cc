// A pointer table built on the device in a small stream-ordered allocation
// (one the driver makes under a cap, never swapped, whose writers stensor
// does not record): each step a kernel on stream `s` stores one of two
// targets' address in it, and a kernel on `s` adds 1 to the target through
// it. Stensor must read the table back before the second launch to know
// its target; that read must wait for `s` only. Meanwhile a host function
// holds another stream until the second launch has been submitted: a wait
// for the whole context would wait for it (the host function gives up
// after a while and the program fails, naming the stall).
//
//   table_writers MODULE.so [--steps N]
//
// MODULE.so: tests/table_source_kernels.so. Prints `working_set <bytes>`
// first and `checksum <hex>` (FNV-1a over both targets) last.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kBuf = 2u << 20;  // one VMM granule
constexpr int kFloats = kBuf / sizeof(float);

// Holds its stream until opened, for two seconds at most.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> gave_up{false};
  static void CUDA_CB Hold(void* self) {
    auto* g = static_cast<Gate*>(self);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!g->open.load()) {
      if (std::chrono::steady_clock::now() > until) {
        g->gave_up = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

void Launch(CUfunction f, CUstream s, std::vector<void*> params) {
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.data(), nullptr));
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 6;
  if (argc == 4 && std::strcmp(argv[2], "--steps") == 0) steps = std::atoi(argv[3]);
  if ((argc != 2 && argc != 4) || steps < 1) {
    std::fputs("usage: table_writers MODULE.so [--steps N]\n", stderr);
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUmodule m;
  CHECK(cuModuleLoad(&m, argv[1]));
  CUfunction add_through, store_ptr;
  CHECK(cuModuleGetFunction(&add_through, m, "_ZN7sources11add_throughEPKPfi"));
  CHECK(cuModuleGetFunction(&store_ptr, m, "_ZN7sources9store_ptrEPmPKf"));
  CUstream s, other;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));

  CUdeviceptr b[2];
  std::vector<float> host(kFloats);
  for (int i = 0; i < 2; ++i) {
    CHECK(cuMemAlloc(&b[i], kBuf));
    for (float& v : host) v = static_cast<float>(i);
    CHECK(cuMemcpyHtoD(b[i], host.data(), kBuf));
  }
  CUdeviceptr table;
  CHECK(cuMemAllocAsync(&table, 64, s));
  CHECK(cuMemsetD8Async(table, 0, 64, s));
  std::printf("working_set %zu\n", 2 * kBuf + 64);

  int n = kFloats;
  Gate gate;
  for (int k = 0; k < steps; ++k) {
    gate.open = false;
    CHECK(cuLaunchHostFunc(other, Gate::Hold, &gate));
    Launch(store_ptr, s, {&table, &b[k % 2]});  // *table = b[k % 2], on the device
    Launch(add_through, s, {&table, &n});       // (*table)[j] += 1
    gate.open = true;
    CHECK(cuStreamSynchronize(other));
    if (gate.gave_up) {
      std::fprintf(stderr, "step %d: the launch through the table waited for another stream\n", k);
      return 1;
    }
  }
  CHECK(cuStreamSynchronize(s));

  uint64_t h = 0xcbf29ce484222325ull;
  for (CUdeviceptr p : b) {
    CHECK(cuMemcpyDtoH(host.data(), p, kBuf));
    h = stensor_tests::Fnv1a(h, host.data(), kBuf);
  }
  CHECK(cuMemFreeAsync(table, s));
  CHECK(cuStreamSynchronize(s));
  for (CUdeviceptr p : b) CHECK(cuMemFree(p));
  CHECK(cuStreamDestroy(s));
  CHECK(cuStreamDestroy(other));
  std::printf("checksum %016" PRIx64 "\n", h);
  return stensor_tests::failures == 0 ? 0 : 1;
}
