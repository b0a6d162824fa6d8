// Host twins of the CUDA kernels in layer_kernels.cuh, linked into the
// examples' modules for the fake driver (tests/fakecuda). Each kernel has
// exactly the C++ signature of its CUDA original, so both carry the same
// mangled name, and does the work of the whole grid in one call: the
// elementwise ones run the per-thread function of thread_ops.h for every
// thread index, the same code the GPU runs; the matrix products
// (host_matmul.h) are reordered for the cache, but every output element
// still receives its terms one at a time in ascending order, from the same
// start, and is combined with its old value by the same one addition, so
// results match bit for bit.
#include <cstddef>
#include <vector>

#include "examples/common/exact_math.h"
#include "examples/common/host_matmul.h"
#include "examples/common/thread_ops.h"
#include "tests/fakecuda/fake_kernel.h"

namespace examples {

FAKECUDA_KERNEL(init_params, float* w, int n, unsigned seed, float scale) {
  for (long long i = 0; i < n; ++i) InitParamsThread(i, w, seed, scale);
}

FAKECUDA_KERNEL(matmul_forward, const float* x, const float* w, const float* b, float* y, int rows,
                int in, int out) {
  exact::MatmulForward(x, w, b, y, rows, in, out);
}

FAKECUDA_KERNEL(matmul_backward_input, const float* dy, const float* w, float* dx, int rows, int in,
                int out) {
  exact::MatmulBackwardInput(dy, w, dx, rows, in, out);
}

FAKECUDA_KERNEL(matmul_backward_params, const float* x, const float* dy, float* dw, float* db,
                int rows, int in, int out, int accumulate) {
  if (!accumulate) {
    exact::MatmulBackwardParams(x, dy, dw, db, rows, in, out);
    return;
  }
  const size_t weights = static_cast<size_t>(in) * out;
  std::vector<float> w_sum(weights), b_sum(out);
  exact::MatmulBackwardParams(x, dy, w_sum.data(), b_sum.data(), rows, in, out);
  for (size_t i = 0; i < weights; ++i) dw[i] = exact::Add(dw[i], w_sum[i]);
  for (int j = 0; j < out; ++j) db[j] = exact::Add(db[j], b_sum[j]);
}

FAKECUDA_KERNEL(add, const float* a, const float* b, float* y, int n) {
  for (long long i = 0; i < n; ++i) AddThread(i, a, b, y);
}

FAKECUDA_KERNEL(relu_forward, const float* pre, float* post, int n) {
  for (long long i = 0; i < n; ++i) ReluForwardThread(i, pre, post);
}

FAKECUDA_KERNEL(relu_backward, const float* pre, float* grad, int n) {
  for (long long i = 0; i < n; ++i) ReluBackwardThread(i, pre, grad);
}

}  // namespace examples
