// A program that frees its buffers while their work is still queued and
// never synchronises, for tests/free_backlog_test.sh. Each iteration
// allocates a 2 MiB buffer, writes it on a stream, copies 4 KiB of it to a
// pinned record of that iteration, and frees the buffer allocated LIVE - 1
// iterations before (LIVE 1: this one), whose work may still be queued:
//
//   memset: cuMemAlloc, cuMemsetD32Async of the whole buffer, cuMemFree;
//   kernel: cuMemAllocAsync, a kernel filling its first and last 4 KiB
//           (tests/fakecuda/test_kernels.so's slow_fill), cuMemFreeAsync.
//
//   free_backlog MODE ITERATIONS LIVE KERNELS.so [mixed]
//
// `mixed`: buffers of 2, 4 and 6 MiB in turn, so that a free's memory
// serves a buffer of another size.
// Only the last cuStreamSynchronize, after the loop, waits for anything.
// Every 1,000 iterations it prints a line
//   block B seconds S maps M rss R creates C queries Q
// : the block's wall time, the process's memory mappings (/proc/self/maps
// lines) and resident bytes at its end, and the fake driver's cuMemCreate
// and cuEventQuery calls during it. At the end every iteration's record must
// hold that iteration's value (a buffer whose memory went to the next owner
// before its own work ran reads the wrong one): `ok`, else a count of bad
// records and exit status 1.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>

#include "tests/driver_check.h"

namespace {

constexpr size_t kMiB2 = size_t{2} << 20;
constexpr size_t kRecord = 4096;  // bytes copied out per iteration
constexpr int kBlock = 1000;

// The fake's call counters (tests/fakecuda/fakecuda.h), found in the
// process: the program is linked to the fake.
using CountCalls = void (*)(int);
using CallCount = unsigned long long (*)(const char*);

int Maps() {
  std::ifstream in("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

long long Rss() {
  std::ifstream in("/proc/self/statm");
  long long size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The value iteration i writes: never 0 (what fresh or zeroed memory holds).
uint32_t Value(int i) { return 0x5a000000u | static_cast<uint32_t>(i + 1); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6 ||
      (std::strcmp(argv[1], "memset") != 0 && std::strcmp(argv[1], "kernel") != 0) ||
      (argc == 6 && std::strcmp(argv[5], "mixed") != 0)) {
    std::fprintf(stderr, "usage: free_backlog memset|kernel ITERATIONS LIVE KERNELS.so [mixed]\n");
    return 2;
  }
  const bool mixed = argc == 6;
  const bool memset_mode = std::strcmp(argv[1], "memset") == 0;
  const int iterations = std::atoi(argv[2]);
  const int live = std::atoi(argv[3]);
  if (iterations < 1 || live < 1) {
    std::fprintf(stderr, "free_backlog: ITERATIONS and LIVE must be positive\n");
    return 2;
  }
  auto count_calls = reinterpret_cast<CountCalls>(dlsym(RTLD_DEFAULT, "fakecuda_count_calls"));
  auto call_count = reinterpret_cast<CallCount>(dlsym(RTLD_DEFAULT, "fakecuda_call_count"));
  if (count_calls == nullptr || call_count == nullptr) {
    std::fprintf(stderr, "free_backlog: not on the fake driver\n");
    return 2;
  }
  count_calls(1);

  stensor_tests::StartOnDevice0();
  CUmodule module;
  CUfunction fill;
  CHECK(cuModuleLoad(&module, argv[4]));
  CHECK(cuModuleGetFunction(&fill, module, "_ZN5testk9slow_fillEPiiii"));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  void* records = nullptr;
  CHECK(cuMemAllocHost(&records, static_cast<size_t>(iterations) * kRecord));
  std::memset(records, 0, static_cast<size_t>(iterations) * kRecord);

  std::deque<CUdeviceptr> held;
  unsigned long long creates = call_count("cuMemCreate"), queries = call_count("cuEventQuery");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    CUdeviceptr p = 0;
    const uint32_t value = Value(i);
    const size_t bytes = mixed ? kMiB2 * (1 + i % 3) : kMiB2;
    if (memset_mode) {
      CHECK(cuMemAlloc(&p, bytes));
      CHECK(cuMemsetD32Async(p, value, bytes / 4, stream));
    } else {
      CHECK(cuMemAllocAsync(&p, bytes, stream));
      int n = static_cast<int>(kRecord / 4), delay_ms = 0;
      int v = static_cast<int>(value);
      for (CUdeviceptr at : {p, p + bytes - kRecord}) {
        void* params[] = {&at, &v, &n, &delay_ms};
        CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
      }
    }
    CHECK(cuMemcpyDtoHAsync(static_cast<char*>(records) + static_cast<size_t>(i) * kRecord,
                            p + bytes - kRecord, kRecord, stream));
    held.push_back(p);
    if (static_cast<int>(held.size()) == live) {
      if (memset_mode) {
        CHECK(cuMemFree(held.front()));
      } else {
        CHECK(cuMemFreeAsync(held.front(), stream));
      }
      held.pop_front();
    }
    if ((i + 1) % kBlock == 0 || i + 1 == iterations) {
      auto now = std::chrono::steady_clock::now();
      unsigned long long c = call_count("cuMemCreate"), q = call_count("cuEventQuery");
      std::printf("block %d seconds %.4f maps %d rss %lld creates %llu queries %llu\n", i / kBlock,
                  std::chrono::duration<double>(now - start).count(), Maps(), Rss(), c - creates,
                  q - queries);
      start = now;
      creates = c;
      queries = q;
    }
  }
  CHECK(cuStreamSynchronize(stream));
  for (CUdeviceptr p : held) CHECK(cuMemFree(p));

  long bad = 0;
  for (int i = 0; i < iterations; ++i) {
    const uint32_t* r = reinterpret_cast<const uint32_t*>(static_cast<char*>(records) +
                                                          static_cast<size_t>(i) * kRecord);
    for (size_t k = 0; k < kRecord / 4; ++k) {
      if (r[k] != Value(i)) {
        if (bad++ < 5) {
          std::fprintf(stderr, "iteration %d: word %zu is %08x, want %08x\n", i, k, r[k], Value(i));
        }
        break;
      }
    }
  }
  CHECK(cuMemFreeHost(records));
  CHECK(cuStreamDestroy(stream));
  if (bad != 0) {
    std::printf("bad records %ld\n", bad);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
