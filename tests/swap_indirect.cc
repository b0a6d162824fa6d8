// A kernel that reaches a buffer through a pointer stored in device memory,
// which access inference cannot see, launched while that buffer is swapped
// out. With host-located VMM the buffer's address reads its host copy, so
// the kernel still gets the right value ("never fault"); without it the
// address is unmapped and the kernel faults, as documented.
//
//   swap_indirect MODULE.so   (under LD_PRELOAD=libstensor.so and a cap of
//                              two 2 MiB granules plus a little)
// Prints `value <v>`; exit 0 when v is the value written.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tests/driver_check.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: swap_indirect MODULE.so\n");
    return 2;
  }
  constexpr size_t kBig = 2u << 20;
  CUmodule module;
  CUfunction load;
  const CUdevice dev = stensor_tests::StartOnDevice0();
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&load, module, "_ZN5testk13load_indirectEPKPKfPf"));

  CUdeviceptr a, table, out, b, c;
  CHECK(cuMemAlloc(&a, kBig));
  std::vector<float> values(kBig / sizeof(float), 2.5f);
  CHECK(cuMemcpyHtoD(a, values.data(), kBig));
  CHECK(cuMemAlloc(&table, sizeof(CUdeviceptr)));
  CHECK(cuMemcpyHtoD(table, &a, sizeof(a)));
  CHECK(cuMemAlloc(&out, sizeof(float)));
  // Two more granules under a cap of two: `a`, least recently used, goes out.
  CHECK(cuMemAlloc(&b, kBig));
  CHECK(cuMemsetD8(b, 1, kBig));
  CHECK(cuMemAlloc(&c, kBig));
  CHECK(cuMemsetD8(c, 2, kBig));

  // Under a cap the program sees the cap as the device's memory.
  if (const char* cap = std::getenv("STENSOR_MEMORY_LIMIT")) {
    size_t free_bytes = 0, total = 0, device_total = 0;
    CHECK(cuMemGetInfo(&free_bytes, &total));
    CHECK(cuDeviceTotalMem(&device_total, dev));
    if (total != std::strtoull(cap, nullptr, 10) || device_total != total || free_bytes > total) {
      std::fprintf(stderr, "cuMemGetInfo: free %zu total %zu, cuDeviceTotalMem %zu, cap %s\n",
                   free_bytes, total, device_total, cap);
      return 1;
    }
  }

  void* params[] = {&table, &out};
  CHECK(cuLaunchKernel(load, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  float got = 0;
  CHECK(cuMemcpyDtoH(&got, out, sizeof(got)));
  std::printf("value %g\n", got);
  return got == 2.5f ? 0 : 1;
}
