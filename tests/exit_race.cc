// exit() from one thread while others keep calling the driver: four
// threads copy to their own buffers, launch a kernel on them and copy back
// (under a cap, so swaps run too); after a number of rounds one of the
// workers calls exit(0). The
// process must end with status 0: no crash, no hang, and (checked by the
// test script) an access log that ends with its end record.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: exit_race KERNELS_SO ROUNDS\n");
    return 2;
  }
  const int rounds = std::atoi(argv[2]);
  stensor_tests::StartOnDevice0();
  CUmodule module = nullptr;
  CUfunction axpy = nullptr;
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&axpy, module, "_ZN5testk4axpyEfPKfPfi"));
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  constexpr size_t kBytes = 3 << 20;
  // exit() comes once every worker is in its loop: a set-up call that fails
  // because exit() began would end the process with CHECK's status 1.
  static std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([=] {
      CHECK(cuCtxSetCurrent(ctx));
      CUdeviceptr x = 0, y = 0;
      CHECK(cuMemAlloc(&x, kBytes));
      CHECK(cuMemAlloc(&y, kBytes));
      ready.fetch_add(1);
      std::vector<float> h(kBytes / sizeof(float), static_cast<float>(t));
      float a = 1;
      int n = static_cast<int>(h.size());
      void* params[] = {&a, &x, &y, &n};
      for (int i = 0;; ++i) {
        // Results are not checked here: once exit() has begun, the driver
        // may answer anything; the process must just end cleanly.
        cuMemcpyHtoD(x, h.data(), kBytes);
        cuLaunchKernel(axpy, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
        cuMemcpyDtoH(h.data(), y, kBytes);
        if (t == 0 && i >= rounds && ready.load() == 4) std::exit(0);
      }
    });
  }
  for (std::thread& t : threads) t.join();  // never returns: thread 0 exits
  return 1;
}
