// What the driver-API test programs under tests/ share: CHECK, which stops
// the program on a failed driver call with the call, its place and the
// error's name (test scripts grep for these), EXPECT_TRUE, which counts a
// failed condition and goes on, and the usual start on the primary context
// of device 0.
#ifndef STENSOR_TESTS_DRIVER_CHECK_H_
#define STENSOR_TESTS_DRIVER_CHECK_H_

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                  \
  do {                                                                               \
    CUresult r_ = (call);                                                            \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char* name_ = nullptr;                                                   \
      cuGetErrorName(r_, &name_);                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call, \
                   name_ != nullptr ? name_ : "?", static_cast<int>(r_));            \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

#define EXPECT_TRUE(cond)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++stensor_tests::failures;                                               \
    }                                                                          \
  } while (0)

namespace stensor_tests {

// Soft checks (EXPECT_TRUE) count here and the program goes on; its exit
// status reports them.
inline int failures = 0;

// cuInit, then device 0's primary context made current.
inline CUdevice StartOnDevice0() {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return dev;
}

}  // namespace stensor_tests

#endif  // STENSOR_TESTS_DRIVER_CHECK_H_
