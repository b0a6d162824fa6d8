// A CUfunction handle reused after cuModuleUnload + cuModuleLoad: the first
// module's `touch` reads buffer x (const float*), the second's, which the
// driver gives the same handle, writes it (float*). If stensor kept the old
// description, the write would be taken for a read, x would stay "clean"
// and a later eviction under the version policy would drop it, losing the
// write.
//
//   module_reload A.so B.so   (under LD_PRELOAD=libstensor.so and a cap of
//                              two 2 MiB granules plus a little)
// Exit 0 when every word of x holds what the second kernel wrote; 1 on a
// wrong value or a failed call; 3 when the driver did not reuse the handle
// (the test would prove nothing).
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/driver_check.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: module_reload A.so B.so\n");
    return 2;
  }
  constexpr size_t kBig = 2u << 20;
  constexpr int kN = kBig / sizeof(float);
  stensor_tests::StartOnDevice0();

  CUdeviceptr x, y, z, out;
  CHECK(cuMemAlloc(&x, kBig));
  std::vector<float> values(kN, 2.0f);
  CHECK(cuMemcpyHtoD(x, values.data(), kBig));
  CHECK(cuMemAlloc(&out, sizeof(float)));
  // Two more granules under a cap of two: x goes out with a copy.
  CHECK(cuMemAlloc(&y, kBig));
  CHECK(cuMemsetD8(y, 1, kBig));
  CHECK(cuMemAlloc(&z, kBig));
  CHECK(cuMemsetD8(z, 2, kBig));

  // The reader brings x back: its host copy is current again.
  CUmodule a;
  CUfunction read;
  int n = kN;
  CHECK(cuModuleLoad(&a, argv[1]));
  CHECK(cuModuleGetFunction(&read, a, "_ZN6reload5touchEPKfPfi"));
  void* params[] = {&x, &out, &n};
  CHECK(cuLaunchKernel(read, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  float sum = 0;
  CHECK(cuMemcpyDtoH(&sum, out, sizeof(sum)));
  if (sum != 2.0f * kN) {
    std::fprintf(stderr, "reader saw sum %g, want %g\n", sum, 2.0f * kN);
    return 1;
  }
  CHECK(cuModuleUnload(a));

  CUmodule b;
  CUfunction write;
  CHECK(cuModuleLoad(&b, argv[2]));
  CHECK(cuModuleGetFunction(&write, b, "_ZN6reload5touchEPfS0_i"));
  if (write != read) {
    std::fprintf(stderr, "the driver gave the writer a new handle\n");
    return 3;
  }
  CHECK(cuLaunchKernel(write, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));

  // Room for y and z again: x is evicted, by a copy if its write was seen,
  // or dropped as clean if it was not.
  CHECK(cuMemsetD8(y, 3, kBig));
  CHECK(cuMemsetD8(z, 4, kBig));

  std::vector<float> got(kN);
  CHECK(cuMemcpyDtoH(got.data(), x, kBig));
  for (int i = 0; i < kN; ++i) {
    float want = 3.0f * i + 1.0f;
    if (std::memcmp(&got[i], &want, sizeof(float)) != 0) {
      std::fprintf(stderr, "x[%d] = %g, want %g: the write was lost\n", i, got[i], want);
      return 1;
    }
  }
  CHECK(cuModuleUnload(b));

  // cuLibraryUnload is hooked too; where the driver lacks it (the fake) the
  // hook says so instead of calling nothing.
  using LibraryUnload = CUresult (*)(CUlibrary);
  const char* library_hook = "absent";
  if (auto unload = reinterpret_cast<LibraryUnload>(dlsym(RTLD_DEFAULT, "cuLibraryUnload"))) {
    CUresult r = unload(nullptr);
    if (r != CUDA_ERROR_NOT_SUPPORTED) {
      std::fprintf(stderr, "cuLibraryUnload without a real one returned %d\n", static_cast<int>(r));
      return 1;
    }
    library_hook = "not supported";
  }
  std::printf("reused handle %p: %d words written and kept; cuLibraryUnload %s\n",
              static_cast<void*>(write), kN, library_hook);
  return 0;
}
