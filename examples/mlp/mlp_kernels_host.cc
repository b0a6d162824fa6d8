// Host twins of the CUDA kernels in mlp_kernels.cu, built into a module for
// the fake driver (tests/fakecuda). Each kernel has exactly the C++ signature
// of its CUDA original, so both carry the same mangled name, and does the work
// of the whole grid in one call.
//
// The matrix products (examples/common/host_matmul.h) are ordered for the
// cache, but every output element still receives its terms one at a time in
// ascending order of the reduction index, starting from the same value as on
// the GPU, so results match the CUDA kernels bit for bit.
#include "examples/common/host_matmul.h"
#include "examples/common/thread_ops.h"
#include "examples/mlp/mlp_math.h"
#include "tests/fakecuda/fake_kernel.h"

namespace mlp {

FAKECUDA_KERNEL(init_params, float* w, int n, unsigned seed, float scale) {
  for (long long i = 0; i < n; ++i) examples::InitParamsThread(i, w, seed, scale);
}

FAKECUDA_KERNEL(synth_shard, float* data, int* labels, int first_sample, int count, int features,
                int classes, unsigned seed, float noise) {
  for (int row = 0; row < count; ++row) {
    const unsigned sample = static_cast<unsigned>(first_sample + row);
    float* out = data + static_cast<long long>(row) * features;
    for (int f = 0; f < features; ++f) {
      out[f] = SampleFeature(seed, sample, f, features, classes, noise);
    }
    labels[row] = SampleLabel(seed, sample, classes);
  }
}

FAKECUDA_KERNEL(gather_batch, const float* data, const int* labels, float* x, int* y, int first,
                int batch, int features) {
  const float* src = data + static_cast<long long>(first) * features;
  const long long n = static_cast<long long>(batch) * features;
  for (long long i = 0; i < n; ++i) x[i] = src[i];
  for (int row = 0; row < batch; ++row) y[row] = labels[first + row];
}

FAKECUDA_KERNEL(linear_forward, const float* x, const float* w, const float* b, float* y, int batch,
                int in, int out) {
  exact::MatmulForward(x, w, b, y, batch, in, out);
}

FAKECUDA_KERNEL(relu_forward, const float* pre, float* post, int n) {
  for (long long i = 0; i < n; ++i) examples::ReluForwardThread(i, pre, post);
}

FAKECUDA_KERNEL(softmax_xent, const float* logits, const int* labels, float* dlogits,
                float* sample_loss, int batch, int classes) {
  for (int r = 0; r < batch; ++r) {
    const long long offset = static_cast<long long>(r) * classes;
    sample_loss[r] = SoftmaxXentRow(logits + offset, labels[r], dlogits + offset, classes, batch);
  }
}

FAKECUDA_KERNEL(mean_loss, const float* sample_loss, float* loss, int batch) {
  float sum = 0.0f;
  for (int i = 0; i < batch; ++i) sum = Add(sum, sample_loss[i]);
  loss[0] = Div(sum, static_cast<float>(batch));
}

FAKECUDA_KERNEL(linear_backward_input, const float* dy, const float* w, float* dx, int batch,
                int in, int out) {
  exact::MatmulBackwardInput(dy, w, dx, batch, in, out);
}

FAKECUDA_KERNEL(linear_backward_params, const float* x, const float* dy, float* dw, float* db,
                int batch, int in, int out) {
  exact::MatmulBackwardParams(x, dy, dw, db, batch, in, out);
}

FAKECUDA_KERNEL(relu_backward, const float* pre, float* grad, int n) {
  for (long long i = 0; i < n; ++i) examples::ReluBackwardThread(i, pre, grad);
}

FAKECUDA_KERNEL(sgd_momentum, float* w, float* v, const float* g, float lr, float momentum, int n) {
  for (int i = 0; i < n; ++i) SgdMomentumStep(&w[i], &v[i], g[i], lr, momentum);
}

}  // namespace mlp
