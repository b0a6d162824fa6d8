// CUDA kernels of the MLP example (examples/mlp/mlp_train.cc), built into a
// cubin for a real GPU. mlp_kernels_host.cc defines the same kernels, with
// the same C++ signatures and so the same mangled names, as host functions
// for the fake driver. The per-thread work of the kernels it shares with
// other examples is in examples/common/thread_ops.h.
//
// Deterministic by construction: no atomics, and every output element is
// computed by one thread that reduces in ascending index order, the order the
// host twins keep too. Launch with a 1-D grid covering the element count the
// comment of each kernel names; surplus threads return at once.
#include "../common/launch_grid.h"
#include "../common/thread_ops.h"
#include "mlp_math.h"

namespace mlp {

using examples::GlobalThreadIndex;

// Threads: n. w[i] = scale * N(0, 1) from the hash RNG stream `seed`.
__global__ void init_params(float* w, int n, unsigned seed, float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  examples::InitParamsThread(i, w, seed, scale);
}

// Threads: count * features. Fills one dataset shard with samples
// [first_sample, first_sample + count) of the synthetic class clusters.
__global__ void synth_shard(float* data, int* labels, int first_sample, int count, int features,
                            int classes, unsigned seed, float noise) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(count) * features) return;
  const int row = static_cast<int>(i / features);
  const int feature = static_cast<int>(i % features);
  const unsigned sample = static_cast<unsigned>(first_sample + row);
  data[i] = SampleFeature(seed, sample, feature, features, classes, noise);
  if (feature == 0) labels[row] = SampleLabel(seed, sample, classes);
}

// Threads: batch * features. Copies rows [first, first + batch) of a shard.
__global__ void gather_batch(const float* data, const int* labels, float* x, int* y, int first,
                             int batch, int features) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * features) return;
  x[i] = data[static_cast<long long>(first) * features + i];
  if (i % features == 0) {
    const int row = static_cast<int>(i / features);
    y[row] = labels[first + row];
  }
}

// Threads: batch * out. y = x w + b, with x [batch, in], w [in, out] and
// y [batch, out] row-major; each sum starts from the bias.
__global__ void linear_forward(const float* x, const float* w, const float* b, float* y, int batch,
                               int in, int out) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * out) return;
  examples::MatmulForwardThread(i, x, w, b, y, in, out);
}

// Threads: n. post = max(pre, 0).
__global__ void relu_forward(const float* pre, float* post, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  examples::ReluForwardThread(i, pre, post);
}

// Threads: batch. Per sample: its cross-entropy loss and the gradient of the
// batch-mean loss with respect to its logits.
__global__ void softmax_xent(const float* logits, const int* labels, float* dlogits,
                             float* sample_loss, int batch, int classes) {
  const long long i = GlobalThreadIndex();
  if (i >= batch) return;
  const long long offset = i * classes;
  sample_loss[i] = SoftmaxXentRow(logits + offset, labels[i], dlogits + offset, classes, batch);
}

// Threads: 1. loss[0] = mean of sample_loss, summed in ascending order.
__global__ void mean_loss(const float* sample_loss, float* loss, int batch) {
  if (GlobalThreadIndex() != 0) return;
  float sum = 0.0f;
  for (int i = 0; i < batch; ++i) sum = Add(sum, sample_loss[i]);
  loss[0] = Div(sum, static_cast<float>(batch));
}

// Threads: batch * in. dx = dy w^T: dx[r][k] = sum over j of dy[r][j] w[k][j].
__global__ void linear_backward_input(const float* dy, const float* w, float* dx, int batch, int in,
                                      int out) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * in) return;
  examples::MatmulBackwardInputThread(i, dy, w, dx, in, out);
}

// Threads: in * out + out. dw = x^T dy (threads [0, in * out)) and
// db = column sums of dy (threads [in * out, in * out + out)), both summed
// over the batch in ascending order. Overwrites, does not accumulate.
__global__ void linear_backward_params(const float* x, const float* dy, float* dw, float* db,
                                       int batch, int in, int out) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(in) * out + out) return;
  examples::MatmulBackwardParamsThread(i, x, dy, dw, db, batch, in, out,
                                       /*accumulate=*/0);
}

// Threads: n. In place on grad: the gradient through max(pre, 0).
__global__ void relu_backward(const float* pre, float* grad, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  examples::ReluBackwardThread(i, pre, grad);
}

// Threads: n. v = momentum * v + g; w -= lr * v.
__global__ void sgd_momentum(float* w, float* v, const float* g, float lr, float momentum, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  SgdMomentumStep(&w[i], &v[i], g[i], lr, momentum);
}

}  // namespace mlp
