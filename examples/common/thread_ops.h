// The per-thread work of the kernels that several examples share (parameter
// initialisation, the matrix products of a dense layer, elementwise add and
// ReLU, a row of causal attention): one function per kernel that computes the output element(s) of
// global thread index `i`. The examples' CUDA kernels call it for their own
// thread; their host twins call it for every thread of the grid, or keep its
// order of terms in a cache-friendly loop (host_matmul.h).
//
// Shapes, row-major: x [rows, in], w [in, out], b [out], y [rows, out].
// Every sum runs in ascending index order, every rounding is one exact::
// operation (exact_math.h), so the GPU and the fake device compute the same
// bits.
//
// Included by .cu files too, so it includes only by relative path.
//
// All functions are pure apart from their output arguments; a thread writes
// only its own elements, so threads never race.
#ifndef STENSOR_EXAMPLES_COMMON_THREAD_OPS_H_
#define STENSOR_EXAMPLES_COMMON_THREAD_OPS_H_

#include "exact_math.h"

namespace examples {

// Threads: n. w[i] = scale * N(0, 1) from the hash RNG stream `seed`.
EXACT_HOST_DEVICE inline void InitParamsThread(long long i, float* w, unsigned seed, float scale) {
  w[i] = exact::InitialParam(seed, static_cast<int>(i), scale);
}

// Threads: rows * out. y = x w + b; each sum starts from the bias.
EXACT_HOST_DEVICE inline void MatmulForwardThread(long long i, const float* x, const float* w,
                                                  const float* b, float* y, int in, int out) {
  const long long row = i / out;
  const int col = static_cast<int>(i % out);
  const float* xr = x + row * in;
  float acc = b[col];
  for (int k = 0; k < in; ++k) {
    acc = exact::MulAdd(acc, xr[k], w[static_cast<long long>(k) * out + col]);
  }
  y[i] = acc;
}

// Threads: rows * in. dx = dy w^T.
EXACT_HOST_DEVICE inline void MatmulBackwardInputThread(long long i, const float* dy,
                                                        const float* w, float* dx, int in,
                                                        int out) {
  const long long row = i / in;
  const int k = static_cast<int>(i % in);
  const float* dyr = dy + row * out;
  const float* wr = w + static_cast<long long>(k) * out;
  float acc = 0.0f;
  for (int j = 0; j < out; ++j) acc = exact::MulAdd(acc, dyr[j], wr[j]);
  dx[i] = acc;
}

// Threads: in * out + out. dw = x^T dy and db = column sums of dy, each from
// 0 over the rows in ascending order; then, when `accumulate` (gradient
// accumulation over micro-batches), added to the old value, else written
// over it.
EXACT_HOST_DEVICE inline void MatmulBackwardParamsThread(long long i, const float* x,
                                                         const float* dy, float* dw, float* db,
                                                         int rows, int in, int out,
                                                         int accumulate) {
  const long long weights = static_cast<long long>(in) * out;
  if (i < weights) {
    const int k = static_cast<int>(i / out);
    const int col = static_cast<int>(i % out);
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) {
      acc = exact::MulAdd(acc, x[static_cast<long long>(r) * in + k],
                          dy[static_cast<long long>(r) * out + col]);
    }
    dw[i] = accumulate ? exact::Add(dw[i], acc) : acc;
  } else if (i < weights + out) {
    const int col = static_cast<int>(i - weights);
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) {
      acc = exact::Add(acc, dy[static_cast<long long>(r) * out + col]);
    }
    db[col] = accumulate ? exact::Add(db[col], acc) : acc;
  }
}

// Threads: n. y = a + b (y may be a).
EXACT_HOST_DEVICE inline void AddThread(long long i, const float* a, const float* b, float* y) {
  y[i] = exact::Add(a[i], b[i]);
}

// Threads: n. post = max(pre, 0).
EXACT_HOST_DEVICE inline void ReluForwardThread(long long i, const float* pre, float* post) {
  post[i] = exact::Relu(pre[i]);
}

// Threads: n. In place on grad: the gradient through max(pre, 0).
EXACT_HOST_DEVICE inline void ReluBackwardThread(long long i, const float* pre, float* grad) {
  if (!(pre[i] > 0.0f)) grad[i] = 0.0f;
}

// Row t of causal attention probabilities for query row q: p[u] = softmax
// over keys u <= t of q . k_u * scale, k_u being the `dim` floats at
// k + u * k_stride; zero for u in (t, seq).
EXACT_HOST_DEVICE inline void CausalAttentionRow(const float* q, const float* k, long long k_stride,
                                                 int dim, int t, int seq, float scale, float* p) {
  float max_score = 0.0f;
  for (int u = 0; u <= t; ++u) {
    const float* ku = k + u * k_stride;
    float dot = 0.0f;
    for (int d = 0; d < dim; ++d) dot = exact::MulAdd(dot, q[d], ku[d]);
    p[u] = exact::Mul(dot, scale);
    max_score = u == 0 || p[u] > max_score ? p[u] : max_score;
  }
  float sum = 0.0f;
  for (int u = 0; u <= t; ++u) {
    p[u] = exact::Exp(exact::Sub(p[u], max_score));
    sum = exact::Add(sum, p[u]);
  }
  for (int u = 0; u <= t; ++u) p[u] = exact::Div(p[u], sum);
  for (int u = t + 1; u < seq; ++u) p[u] = 0.0f;
}

}  // namespace examples

#endif  // STENSOR_EXAMPLES_COMMON_THREAD_OPS_H_
