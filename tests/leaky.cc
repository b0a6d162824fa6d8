// Leaves device buffers allocated at exit, for the leak report
// (core/tracker/leaks.h): a 2 MiB and a 1 MiB buffer used by a kernel, a 64 KiB
// stream-ordered one never used, and a 4 KiB one that is freed.
#include <cstdio>

#include "tests/driver_check.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: leaky KERNELS_SO\n");
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUmodule module = nullptr;
  CUfunction axpy = nullptr;
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&axpy, module, "_ZN5testk4axpyEfPKfPfi"));
  CUdeviceptr x = 0, y = 0, freed = 0, async = 0;
  CHECK(cuMemAlloc(&x, 1 << 20));
  CHECK(cuMemAlloc(&y, 2 << 20));
  CHECK(cuMemAlloc(&freed, 4 << 10));
  CHECK(cuMemAllocAsync(&async, 64 << 10, nullptr));
  CHECK(cuMemsetD8(x, 0, 1 << 20));
  CHECK(cuMemsetD8(y, 0, 2 << 20));
  float a = 2;
  int n = (1 << 20) / sizeof(float);
  void* params[] = {&a, &x, &y, &n};
  CHECK(cuLaunchKernel(axpy, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemFree(freed));
  std::printf("ok\n");
  return 0;  // x, y and async are never freed
}
