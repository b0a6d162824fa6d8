// What the driver-API test programs under tests/ share: CHECK, which stops
// the program on a failed driver call with the call, its place and the
// error's name (test scripts grep for these), EXPECT_TRUE, which counts a
// failed condition and goes on, and the usual start on the primary context
// of device 0.
#ifndef STENSOR_TESTS_DRIVER_CHECK_H_
#define STENSOR_TESTS_DRIVER_CHECK_H_

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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

// Reads device memory at `p` back (a synchronous copy, from wherever it is)
// and counts a failure naming the first word that differs from `model`.
template <typename T>
void ExpectDevice(CUdeviceptr p, const std::vector<T>& model, const char* name) {
  std::vector<T> got(model.size());
  CHECK(cuMemcpyDtoH_v2(got.data(), p, got.size() * sizeof(T)));
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &model[i], sizeof(T)) != 0 && wrong++ == 0) first = i;
  }
  if (wrong != 0) {
    std::fprintf(stderr, "%s: %zu of %zu words wrong, first at %zu\n", name, wrong, got.size(),
                 first);
    ++failures;
  }
}

// FNV-1a over bytes, from `h` (a program's checksum of its results).
inline uint64_t Fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace stensor_tests

#endif  // STENSOR_TESTS_DRIVER_CHECK_H_
