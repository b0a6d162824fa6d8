// A write access inference cannot see, followed by a clean drop: x gets a
// host copy (evicted under a cap of two granules), comes back for
// lying::scale_in_place, which declares it const and writes it, and is
// evicted again. Version control sees no write and drops it as clean unless
// STENSOR_VERIFY catches the difference and copies it.
//
//   verify_clean_drop MODULE.so   (under LD_PRELOAD=libstensor.so and a cap
//                                  of two 2 MiB granules plus a little)
// Prints `checksum <hex>` over x's final bytes (FNV-1a), identical to the run
// without stensor when nothing was lost.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "tests/driver_check.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: verify_clean_drop MODULE.so\n");
    return 2;
  }
  constexpr size_t kBig = 2u << 20;
  int n = kBig / sizeof(float);
  CUmodule module;
  CUfunction scale;
  stensor_tests::StartOnDevice0();
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&scale, module, "_ZN5lying14scale_in_placeEPKffi"));

  CUdeviceptr x, y, z;
  CHECK(cuMemAlloc(&x, kBig));
  std::vector<float> values(n);
  for (int i = 0; i < n; ++i) values[i] = 0.5f * static_cast<float>(i % 4096) + 1.0f;
  CHECK(cuMemcpyHtoD(x, values.data(), kBig));
  // Two more granules under a cap of two: x goes out with a copy.
  CHECK(cuMemAlloc(&y, kBig));
  CHECK(cuMemsetD8(y, 1, kBig));
  CHECK(cuMemAlloc(&z, kBig));
  CHECK(cuMemsetD8(z, 2, kBig));

  // x comes back, and is written where a read was declared.
  float factor = 3.0f;
  void* params[] = {&x, &factor, &n};
  CHECK(cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  // Room for y and z again: x is evicted.
  CHECK(cuMemsetD8(y, 3, kBig));
  CHECK(cuMemsetD8(z, 4, kBig));

  std::vector<unsigned char> got(kBig);
  CHECK(cuMemcpyDtoH(got.data(), x, kBig));
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : got) h = (h ^ c) * 0x100000001b3ull;
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  return 0;
}
