// The second module of module_reload: a `touch` that writes its buffer,
// loaded where the first module's was, so it gets the same CUfunction.
#include "tests/fakecuda/fake_kernel.h"

namespace reload {

FAKECUDA_KERNEL(touch, float* x, float* out, int n) {
  for (int i = 0; i < n; ++i) x[i] = 3.0f * i + 1.0f;
  out[0] = static_cast<float>(n);
}

}  // namespace reload
