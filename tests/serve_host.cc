// Operations whose buffers do not fit under the cap together, and buffers
// larger than the cap: with host-located VMM stensor serves what does not
// fit from its host copy at its address rather than refusing; every result
// is checked word for word against a host model. On several streams, with
// the program's own events between them, and frees right behind the work:
//   1. y += 2x over two buffers that together exceed the cap (served);
//   2. on a second stream, after an event: z += y (served, reading what 1
//      wrote through the host mapping);
//   3. a buffer larger than the cap, born in host memory, filled by a slow
//      kernel on the first stream, while
//   4. the second stream uses y alone (it fits: brought in, after the
//      served writes of 1 and of 2's reads);
//   5. a temporary larger than half the cap written, read into y's model
//      by a copy, and freed (cuMemFree or cuMemFreeAsync) while its work is
//      still queued;
//   6. y read back to the host, from wherever it is; every other round z
//      and the big buffer too.
// Prints "checksum <hex>" (a hash of every buffer at the end) and "ok".
// Out of memory (expected without host-located VMM) prints
// "oom <call>" and exits 3.
//
// usage: serve_host KERNELS.so ITERATIONS [async]
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kN = size_t{6} << 20;     // floats: 24 MiB per buffer
constexpr size_t kBig = size_t{10} << 20;  // ints: 40 MiB, over a 32 MiB cap
constexpr size_t kTemp = size_t{5} << 20;  // floats: 20 MiB

CUfunction g_axpy, g_fill;

// A launch or copy that ran out of memory: what the test expects without
// host-located VMM; any other failure stops the program as CHECK does.
void Run(CUresult r, const char* what) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    std::printf("oom %s\n", what);
    std::fflush(stdout);
    std::exit(3);
  }
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    std::fprintf(stderr, "%s failed: %s\n", what, name ? name : "?");
    std::exit(1);
  }
}

void Axpy(float a, CUdeviceptr x, CUdeviceptr y, size_t n, CUstream s) {
  int count = static_cast<int>(n);
  void* params[] = {&a, &x, &y, &count};
  Run(cuLaunchKernel(g_axpy, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr), "axpy");
}

void Fill(CUdeviceptr out, int value, size_t n, int delay_ms, CUstream s) {
  int count = static_cast<int>(n);
  void* params[] = {&out, &value, &count, &delay_ms};
  Run(cuLaunchKernel(g_fill, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr), "slow_fill");
}

template <typename T>
void Expect(CUdeviceptr p, const std::vector<T>& model, const char* name) {
  std::vector<T> got(model.size());
  Run(cuMemcpyDtoH_v2(got.data(), p, got.size() * sizeof(T)), "read back");
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &model[i], sizeof(T)) != 0 && wrong++ == 0) first = i;
  }
  if (wrong != 0) {
    std::fprintf(stderr, "%s: %zu of %zu words wrong, first at %zu\n", name, wrong, got.size(),
                 first);
    ++stensor_tests::failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: serve_host KERNELS.so ITERATIONS [async]\n");
    return 2;
  }
  const int iterations = std::atoi(argv[2]);
  const bool async_free = argc > 3 && std::string(argv[3]) == "async";
  stensor_tests::StartOnDevice0();
  CUmodule module;
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&g_axpy, module, "_ZN5testk4axpyEfPKfPfi"));
  CHECK(cuModuleGetFunction(&g_fill, module, "_ZN5testk9slow_fillEPiiii"));
  CUstream s1, s2;
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CUevent e1;
  CHECK(cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));

  CUdeviceptr x, y, z, big;
  Run(cuMemAlloc_v2(&x, kN * 4), "alloc x");
  Run(cuMemAlloc_v2(&y, kN * 4), "alloc y");
  Run(cuMemAlloc_v2(&z, kN * 4), "alloc z");
  Run(cuMemAlloc_v2(&big, kBig * 4), "alloc big");
  std::vector<float> hx(kN), hy(kN), hz(kN);
  std::vector<int> hbig(kBig, 0);
  for (size_t i = 0; i < kN; ++i) {
    hx[i] = static_cast<float>(i % 7);
    hy[i] = static_cast<float>(i % 5);
    hz[i] = static_cast<float>(i % 3);
  }
  Run(cuMemcpyHtoD_v2(x, hx.data(), kN * 4), "upload x");
  Run(cuMemcpyHtoD_v2(y, hy.data(), kN * 4), "upload y");
  Run(cuMemcpyHtoD_v2(z, hz.data(), kN * 4), "upload z");

  for (int it = 0; it < iterations; ++it) {
    // Small integers stay exact: y is reset to the model's start each round.
    Axpy(2.0f, x, y, kN, s1);  // 1
    for (size_t i = 0; i < kN; ++i) hy[i] += 2 * hx[i];
    CHECK(cuEventRecord(e1, s1));
    CHECK(cuStreamWaitEvent(s2, e1, 0));
    Axpy(1.0f, y, z, kN, s2);  // 2
    for (size_t i = 0; i < kN; ++i) hz[i] += hy[i];
    Fill(big, it + 1, kBig, 2, s1);  // 3
    std::fill(hbig.begin(), hbig.end(), it + 1);
    CHECK(cuEventRecord(e1, s2));
    CHECK(cuStreamWaitEvent(s1, e1, 0));
    Axpy(-1.0f, y, y, kN, s1);  // 4: y - y = 0, then back to the start
    for (size_t i = 0; i < kN; ++i) hy[i] = 0;
    CUdeviceptr t;  // 5
    Run(cuMemAlloc_v2(&t, kTemp * 4), "alloc temp");
    Fill(t, 3, kTemp, 1, s1);
    Axpy(1.0f, t, y, kTemp, s1);  // y[i] += bits of int 3 read as float
    float three;
    const int three_bits = 3;
    std::memcpy(&three, &three_bits, 4);
    for (size_t i = 0; i < kTemp; ++i) hy[i] += three;
    if (async_free) {
      Run(cuMemFreeAsync(t, s1), "free temp");
    } else {
      Run(cuMemFree_v2(t), "free temp");
    }
    CHECK(cuStreamSynchronize(s1));
    Expect(y, hy, "y");  // 6: read back, from wherever it is
    for (size_t i = 0; i < kN; ++i) hy[i] = static_cast<float>(i % 5);
    Run(cuMemcpyHtoDAsync_v2(y, hy.data(), kN * 4, s1), "reset y");
    CHECK(cuStreamSynchronize(s1));
    CHECK(cuStreamSynchronize(s2));
    if (it % 2 == 1) {
      Expect(z, hz, "z");
      Expect(big, hbig, "big");
    }
  }
  CHECK(cuCtxSynchronize());
  Expect(x, hx, "x");
  Expect(y, hy, "y");
  Expect(z, hz, "z");
  Expect(big, hbig, "big");
  uint64_t h = 1469598103934665603ull;
  h = stensor_tests::Fnv1a(h, hx.data(), kN * 4);
  h = stensor_tests::Fnv1a(h, hy.data(), kN * 4);
  h = stensor_tests::Fnv1a(h, hz.data(), kN * 4);
  h = stensor_tests::Fnv1a(h, hbig.data(), kBig * 4);
  for (CUdeviceptr p : {x, y, z, big}) Run(cuMemFree_v2(p), "free");
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  if (stensor_tests::failures != 0) {
    std::fprintf(stderr, "%d checks failed\n", stensor_tests::failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
