// The first module of module_reload: `touch` only reads its buffer.
#include "tests/fakecuda/fake_kernel.h"

namespace reload {

FAKECUDA_KERNEL(touch, const float* x, float* out, int n) {
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += x[i];
  out[0] = sum;
}

}  // namespace reload
