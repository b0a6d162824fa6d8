// Host kernels for the benchmarks: a launch with six pointer parameters, the
// shape the launch-hook target is stated for. It does no work, so the
// measurement is the launch path itself.
#include "tests/fakecuda/fake_kernel.h"

namespace bench {

FAKECUDA_KERNEL(six_pointers, const float* a, const float* b, const float* c, float* d, float* e,
                float* f) {
  (void)a, (void)b, (void)c, (void)d, (void)e, (void)f;
}

}  // namespace bench
