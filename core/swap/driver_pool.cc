#include "core/swap/driver_pool.h"

namespace stensor {

void DriverPool::Trim(const Driver& driver, int ordinal, uint64_t* errors) {
  if (driver.cuMemPoolTrimTo == nullptr || driver.cuDeviceGetDefaultMemPool == nullptr ||
      driver.cuDeviceGet == nullptr) {
    return;  // a driver without pools keeps no freed memory
  }
  if (!looked_up_) {
    looked_up_ = true;
    CUdevice device = 0;
    CUresult r = driver.cuDeviceGet(&device, ordinal);
    if (r == CUDA_SUCCESS) r = driver.cuDeviceGetDefaultMemPool(&pool_, device);
    if (r != CUDA_SUCCESS) {
      ++*errors;
      pool_ = nullptr;
    }
  }
  if (pool_ != nullptr && driver.cuMemPoolTrimTo(pool_, 0) != CUDA_SUCCESS) ++*errors;
}

}  // namespace stensor
