// Two devices driven from four threads, for tests/multi_device_test.sh: each
// thread has one device's primary context current (threads 0 and 2 device
// 0's, 1 and 3 device 1's) and owns four 2 MiB buffers on each device. Every
// round it runs axpy on two of its current device's buffers (on its stream or the NULL
// stream), once in a while on two of the other device's with that
// device's context pushed, and copies one buffer to the other device with one of the
// cross-device copies, in either direction: cuMemcpyPeer(Async),
// cuMemcpy(Async) through unified addressing, cuMemcpyDtoD(Async). Under a
// per-device cap below the working set, the buffers a copy or a launch names
// are often swapped out when it is issued.
//
//   multi_device MODULE.so ROUNDS   (MODULE: tests/fakecuda/test_kernels.so)
//
// Prints `checksum <hex>` over every byte of every buffer, read back at the
// end: the same with and without stensor, under any cap that fits, when
// swapping is correct. Thread t's work depends only on t, so the checksum
// does not depend on how the threads interleave.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr int kThreads = 4;
constexpr int kDevices = 2;
constexpr size_t kFloats = (2u << 20) / sizeof(float);
constexpr size_t kBytes = kFloats * sizeof(float);
constexpr int kPerThread = 4;  // buffers per thread and device

struct Device {
  CUcontext ctx = nullptr;
  CUfunction axpy = nullptr;
  CUdeviceptr buf[kThreads][kPerThread] = {};  // thread t's
};
Device g_dev[kDevices];

// y += a * x on thread t's buffers j (x) and j + 1 (y) of device d, with d's
// context current.
void Axpy(int d, int t, int j, float a, CUstream s) {
  int n = static_cast<int>(kFloats);
  CUdeviceptr x = g_dev[d].buf[t][j], y = g_dev[d].buf[t][(j + 1) % kPerThread];
  void* params[] = {&a, &x, &y, &n};
  CHECK(cuLaunchKernel(g_dev[d].axpy, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
}

// Copies buffer `which` of thread t from device `from` to device `to`, the
// way `form` says, from a thread whose current context is device `home`'s
// (stream `s` is that context's).
void CrossCopy(int t, int from, int to, int which, int form, CUstream s) {
  CUdeviceptr src = g_dev[from].buf[t][which], dst = g_dev[to].buf[t][which];
  switch (form) {
    case 0:
      CHECK(cuMemcpyPeer(dst, g_dev[to].ctx, src, g_dev[from].ctx, kBytes));
      break;
    case 1:
      CHECK(cuMemcpyPeerAsync(dst, g_dev[to].ctx, src, g_dev[from].ctx, kBytes, s));
      break;
    case 2:
      CHECK(cuMemcpy(dst, src, kBytes));
      break;
    case 3:
      CHECK(cuMemcpyAsync(dst, src, kBytes, s));
      break;
    case 4:
      CHECK(cuMemcpyDtoD(dst, src, kBytes));
      break;
    default:
      CHECK(cuMemcpyDtoDAsync(dst, src, kBytes, s));
      break;
  }
  // The program orders its own work: nothing on another context's streams
  // waits for this stream.
  CHECK(cuStreamSynchronize(s));
  CHECK(cuCtxSynchronize());
}

void Work(int t, int rounds) {
  const int home = t % kDevices, other = 1 - home;
  CHECK(cuCtxSetCurrent(g_dev[home].ctx));
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));  // blocking: the NULL stream orders it
  std::mt19937 rng(77 + t);
  for (int round = 0; round < rounds; ++round) {
    const float a = 0.25f + 0.125f * static_cast<float>(rng() % 4);
    Axpy(home, t, static_cast<int>(rng() % kPerThread), a, rng() % 2 ? s : nullptr);
    CHECK(cuStreamSynchronize(s));
    if (rng() % 4 == 0) {  // the other device's pair, its context pushed
      CHECK(cuCtxPushCurrent(g_dev[other].ctx));
      Axpy(other, t, static_cast<int>(rng() % kPerThread), a, nullptr);
      CHECK(cuCtxSynchronize());
      CUcontext popped;
      CHECK(cuCtxPopCurrent(&popped));
      if (popped != g_dev[other].ctx) {
        std::fprintf(stderr, "thread %d: popped another context\n", t);
        std::exit(1);
      }
    }
    const bool outward = rng() % 2;
    CrossCopy(t, outward ? home : other, outward ? other : home,
              static_cast<int>(rng() % kPerThread), static_cast<int>(rng() % 6), s);
  }
  CHECK(cuStreamDestroy(s));
}

// FNV-1a over bytes.
uint64_t Hash(uint64_t h, const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: multi_device MODULE.so ROUNDS\n");
    return 2;
  }
  const int rounds = std::atoi(argv[2]);
  CHECK(cuInit(0));
  int count = 0;
  CHECK(cuDeviceGetCount(&count));
  if (count < kDevices) {
    std::fprintf(stderr, "multi_device: needs %d devices, found %d\n", kDevices, count);
    return 2;
  }
  std::vector<float> init(kFloats);
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cuDevicePrimaryCtxRetain(&g_dev[d].ctx, d));
    CHECK(cuCtxSetCurrent(g_dev[d].ctx));
    CUmodule module;  // a module per context, as on a GPU
    CHECK(cuModuleLoad(&module, argv[1]));
    CHECK(cuModuleGetFunction(&g_dev[d].axpy, module, "_ZN5testk4axpyEfPKfPfi"));
    for (int t = 0; t < kThreads; ++t) {
      for (int k = 0; k < kPerThread; ++k) {
        CHECK(cuMemAlloc(&g_dev[d].buf[t][k], kBytes));
        for (size_t i = 0; i < kFloats; ++i) {
          init[i] = static_cast<float>((i * 7 + d * 3 + t * 5 + k) % 97) / 64.0f;
        }
        CHECK(cuMemcpyHtoD(g_dev[d].buf[t][k], init.data(), kBytes));
      }
    }
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(Work, t, rounds);
  for (std::thread& th : threads) th.join();

  uint64_t h = 1469598103934665603ull;
  std::vector<float> back(kFloats);
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cuCtxSetCurrent(g_dev[d].ctx));
    for (int t = 0; t < kThreads; ++t) {
      for (int k = 0; k < kPerThread; ++k) {
        CHECK(cuMemcpyDtoH(back.data(), g_dev[d].buf[t][k], kBytes));
        h = Hash(h, back);
        CHECK(cuMemFree(g_dev[d].buf[t][k]));
      }
    }
  }
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  return 0;
}
