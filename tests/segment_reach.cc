// Tensors carved out of one large segment, as a caching allocator carves
// them, and kernels whose pointers say where a tensor starts but not where
// it ends: under a cap, of a swapped-out segment stensor fetches what a
// kernel's pointers likely reach (up to the next tensor bound seen) and
// serves the rest from host. Here kernels also reach past that guess, by
// reading and writing through one pointer into the next tensor; every word
// is checked against a host model each round.
//   seg: 20 MiB, tensors A [0, 4 MiB), B [4, 8), C [8, 20), uploaded
//        by exact copies (which show their bounds);
//   other: 16 MiB, uploaded after them (pushing part of seg out);
//   1. A += 2 other[0, 1M)          (a pointer to A: A's pieces fetched)
//   2. A and B += other[0, 2M)      (through A's pointer, past its bound)
//   3. other[0, 3M) += C / 2        (C read through its own pointer)
//   4. the next round's uploads cover A and B, C every other round.
// With `threads`, C belongs to a second thread on its own stream, at the
// same time as 1 and 2: it uploads C, then C += other2[0, 3M) and
// other2[0, 3M) += C / 2 (other2: 16 MiB of its own); step 3 is left out.
// Both threads hold the segment at once, one of them perhaps serving the
// pieces the other fetches.
// Prints "checksum <hex>" (of the model) and "ok".
//
// usage: segment_reach KERNELS.so ROUNDS [threads]
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kM = size_t{1} << 20;  // floats: 4 MiB
constexpr size_t kSeg = 5 * kM, kOther = 4 * kM;
constexpr size_t kA = 0, kB = kM, kC = 2 * kM;

CUfunction g_axpy;

void Axpy(float a, CUdeviceptr x, CUdeviceptr y, size_t n, CUstream s) {
  int count = static_cast<int>(n);
  void* params[] = {&a, &x, &y, &count};
  CHECK(cuLaunchKernel(g_axpy, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: segment_reach KERNELS.so ROUNDS\n");
    return 2;
  }
  const int rounds = std::atoi(argv[2]);
  const bool threads = argc > 3 && std::string(argv[3]) == "threads";
  stensor_tests::StartOnDevice0();
  CUcontext ctx;
  CHECK(cuCtxGetCurrent(&ctx));
  CUmodule module;
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&g_axpy, module, "_ZN5testk4axpyEfPKfPfi"));
  CUstream s, s2;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CUdeviceptr seg, other, other2;
  CHECK(cuMemAlloc_v2(&seg, kSeg * 4));
  CHECK(cuMemAlloc_v2(&other, kOther * 4));
  CHECK(cuMemAlloc_v2(&other2, kOther * 4));
  std::vector<float> hseg(kSeg), hother(kOther), hother2(kOther);
  uint64_t h = 1469598103934665603ull;
  for (int r = 0; r < rounds; ++r) {
    // Small integers and halves: every sum exact.
    for (size_t i = 0; i < kC; ++i) hseg[i] = static_cast<float>((i + r) % 7);
    CHECK(cuMemcpyHtoDAsync_v2(seg + kA * 4, hseg.data() + kA, kM * 4, s));
    CHECK(cuMemcpyHtoDAsync_v2(seg + kB * 4, hseg.data() + kB, kM * 4, s));
    // C's part: on this thread and stream, or on a second one meanwhile.
    auto tensor_c = [&](CUstream on) {
      if (r % 2 == 0) {
        for (size_t i = kC; i < kSeg; ++i) hseg[i] = static_cast<float>((i + r) % 4);
        CHECK(cuMemcpyHtoDAsync_v2(seg + kC * 4, hseg.data() + kC, 3 * kM * 4, on));
      }
      if (!threads) return;
      for (size_t i = 0; i < kOther; ++i) hother2[i] = static_cast<float>((i * 5 + r) % 3);
      CHECK(cuMemcpyHtoDAsync_v2(other2, hother2.data(), kOther * 4, on));
      Axpy(1.0f, other2, seg + kC * 4, 3 * kM, on);
      for (size_t i = 0; i < 3 * kM; ++i) hseg[kC + i] += hother2[i];
      Axpy(0.5f, seg + kC * 4, other2, 3 * kM, on);
      for (size_t i = 0; i < 3 * kM; ++i) hother2[i] += 0.5f * hseg[kC + i];
      CHECK(cuStreamSynchronize(on));
    };
    std::thread second;
    if (threads) {
      second = std::thread([&] {
        CHECK(cuCtxSetCurrent(ctx));
        tensor_c(s2);
      });
    } else {
      tensor_c(s);
    }
    for (size_t i = 0; i < kOther; ++i) hother[i] = static_cast<float>((i * 3 + r) % 5);
    CHECK(cuMemcpyHtoDAsync_v2(other, hother.data(), kOther * 4, s));
    Axpy(2.0f, other, seg + kA * 4, kM, s);  // 1
    for (size_t i = 0; i < kM; ++i) hseg[kA + i] += 2 * hother[i];
    Axpy(1.0f, other, seg + kA * 4, 2 * kM, s);  // 2: A's pointer, into B
    for (size_t i = 0; i < 2 * kM; ++i) hseg[kA + i] += hother[i];
    if (!threads) {
      Axpy(0.5f, seg + kC * 4, other, 3 * kM, s);  // 3
      for (size_t i = 0; i < 3 * kM; ++i) hother[i] += 0.5f * hseg[kC + i];
    }
    CHECK(cuStreamSynchronize(s));
    if (threads) second.join();
    stensor_tests::ExpectDevice(seg, hseg, "seg");
    stensor_tests::ExpectDevice(other, hother, "other");
    h = stensor_tests::Fnv1a(h, hseg.data(), kSeg * 4);
    h = stensor_tests::Fnv1a(h, hother.data(), kOther * 4);
    if (threads) {
      stensor_tests::ExpectDevice(other2, hother2, "other2");
      h = stensor_tests::Fnv1a(h, hother2.data(), kOther * 4);
    }
  }
  CHECK(cuMemFree_v2(seg));
  CHECK(cuMemFree_v2(other));
  CHECK(cuMemFree_v2(other2));
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  if (stensor_tests::failures != 0) {
    std::fprintf(stderr, "%d checks failed\n", stensor_tests::failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
