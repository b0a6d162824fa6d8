// A kernel that lies about its accesses: it declares its buffer `const`
// (so access inference sees a read) and writes it anyway, through a cast.
// Version control then believes the buffer's host copy is current and would
// drop the device copy as clean; STENSOR_VERIFY must catch it.
#include "tests/fakecuda/fake_kernel.h"

namespace lying {

FAKECUDA_KERNEL(scale_in_place, const float* x, float factor, int n) {
  float* writable = const_cast<float*>(x);
  for (int i = 0; i < n; ++i) writable[i] = x[i] * factor;
}

}  // namespace lying
