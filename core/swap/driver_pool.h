// DriverPool: a device's default stream-ordered memory pool, as the memory
// manager needs it. Freed stream-ordered memory the driver keeps reserved
// (up to the pool's release threshold) is device memory the cap no longer
// charges, so before stensor creates device memory of its own it has the
// driver give that back. The pool entry points are optional (a driver
// without pools keeps nothing) and each is checked here, so this lives apart
// from the entry points swapping requires (core/swap/swap_entry_points.inc).
//
// Thread-safety: none; the memory manager calls it under its mutex.
#ifndef STENSOR_CORE_SWAP_DRIVER_POOL_H_
#define STENSOR_CORE_SWAP_DRIVER_POOL_H_

#include <cstdint>

#include "core/driver/driver.h"

namespace stensor {

class DriverPool {
 public:
  // Releases the unused memory of device `ordinal`'s default pool (its
  // handle looked up once). Each failed driver call adds one to *errors.
  void Trim(const Driver& driver, int ordinal, uint64_t* errors);

 private:
  bool looked_up_ = false;
  CUmemoryPool pool_ = nullptr;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_DRIVER_POOL_H_
