// The per-thread work of the transformer example's kernels: one function per
// kernel that computes the output element(s) of global thread index `i`
// (those of the kernels it shares with other examples are in
// examples/common/thread_ops.h). The CUDA kernels (transformer_kernels.cu)
// call it for their own thread; the host twins (transformer_kernels_host.cc)
// call it for every thread of the grid, except the embedding gradient, which
// they compute with a cache-friendly loop that keeps the same order of terms.
//
// Shapes, row-major: rows = batch * seq tokens; `qkv` is [rows, 3 dim] with
// q, k, v side by side per row; `probs` is [batch, seq, seq], causal (zero
// above the diagonal). Tokens are [batch, seq + 1]: inputs at [0, seq),
// targets shifted by one. Every sum runs in ascending index order.
//
// All functions are pure apart from their output arguments; a thread writes
// only its own elements, so threads never race.
#ifndef STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_OPS_H_
#define STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_OPS_H_

// Relative, so that nvcc finds it beside transformer_kernels.cu too.
#include "../common/thread_ops.h"
#include "transformer_math.h"

namespace tfm {

constexpr float kLayerNormEpsilon = 1e-5f;

// Threads: batch * (seq + 1). The training tokens of step `step`.
TFM_HOST_DEVICE inline void SynthTokensThread(long long i, int* tokens, int seq, int vocab,
                                              int batch, unsigned seed, int step) {
  const int width = seq + 1;
  const int b = static_cast<int>(i / width);
  const int t = static_cast<int>(i % width);
  const unsigned sequence =
      static_cast<unsigned>(step) * static_cast<unsigned>(batch) + static_cast<unsigned>(b);
  tokens[i] = SequenceToken(seed, sequence, t, vocab);
}

// Threads: rows * dim. x = embedding row of the token + position code.
TFM_HOST_DEVICE inline void EmbedThread(long long i, const int* tokens, const float* table,
                                        float* x, int seq, int dim) {
  const long long row = i / dim;
  const int d = static_cast<int>(i % dim);
  const int b = static_cast<int>(row / seq);
  const int t = static_cast<int>(row % seq);
  const int token = tokens[static_cast<long long>(b) * (seq + 1) + t];
  x[i] = Add(table[static_cast<long long>(token) * dim + d], PositionCode(t, d));
}

// Mean and 1 / standard deviation of row `row` of x [rows, dim].
TFM_HOST_DEVICE inline void RowMoments(const float* x, long long row, int dim, float* mean,
                                       float* rstd) {
  const float* r = x + row * dim;
  float sum = 0.0f;
  for (int d = 0; d < dim; ++d) sum = Add(sum, r[d]);
  const float mu = Div(sum, static_cast<float>(dim));
  float squares = 0.0f;
  for (int d = 0; d < dim; ++d) {
    const float c = Sub(r[d], mu);
    squares = MulAdd(squares, c, c);
  }
  *mean = mu;
  *rstd = Div(1.0f, Sqrt(Add(Div(squares, static_cast<float>(dim)), kLayerNormEpsilon)));
}

// Threads: rows. y = (x - mean) * rstd * gain + bias per row; saves the
// row's mean and rstd for the backward pass.
TFM_HOST_DEVICE inline void LayerNormForwardThread(long long row, const float* x, const float* gain,
                                                   const float* bias, float* y, float* mean,
                                                   float* rstd, int dim) {
  float mu = 0.0f, rs = 0.0f;
  RowMoments(x, row, dim, &mu, &rs);
  mean[row] = mu;
  rstd[row] = rs;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  for (int d = 0; d < dim; ++d) {
    yr[d] = Add(Mul(Mul(Sub(xr[d], mu), rs), gain[d]), bias[d]);
  }
}

// Threads: rows * dim + dim. Threads [0, rows * dim): dx of one element,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gain.
// Threads [rows * dim, rows * dim + dim): dgain and dbias of one feature,
// summed over the rows.
TFM_HOST_DEVICE inline void LayerNormBackwardThread(long long i, const float* x, const float* gain,
                                                    const float* mean, const float* rstd,
                                                    const float* dy, float* dx, float* dgain,
                                                    float* dbias, int rows, int dim) {
  const long long elements = static_cast<long long>(rows) * dim;
  if (i < elements) {
    const long long row = i / dim;
    const float mu = mean[row], rs = rstd[row];
    const float* xr = x + row * dim;
    const float* dyr = dy + row * dim;
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int d = 0; d < dim; ++d) {
      const float g = Mul(dyr[d], gain[d]);
      sum_g = Add(sum_g, g);
      sum_gx = MulAdd(sum_gx, g, Mul(Sub(xr[d], mu), rs));
    }
    const float dim_f = static_cast<float>(dim);
    const int d = static_cast<int>(i % dim);
    const float xhat = Mul(Sub(xr[d], mu), rs);
    const float g = Mul(dyr[d], gain[d]);
    dx[i] = Mul(rs, Sub(Sub(g, Div(sum_g, dim_f)), Mul(xhat, Div(sum_gx, dim_f))));
  } else if (i < elements + dim) {
    const int d = static_cast<int>(i - elements);
    float sum_gain = 0.0f, sum_bias = 0.0f;
    for (int r = 0; r < rows; ++r) {
      const long long j = static_cast<long long>(r) * dim + d;
      const float xhat = Mul(Sub(x[j], mean[r]), rstd[r]);
      sum_gain = MulAdd(sum_gain, dy[j], xhat);
      sum_bias = Add(sum_bias, dy[j]);
    }
    dgain[d] = sum_gain;
    dbias[d] = sum_bias;
  }
}

// Threads: batch * seq. Row (b, query t) of the causal attention
// probabilities: softmax over keys u <= t of q_t . k_u / sqrt(dim); zero for
// u > t.
TFM_HOST_DEVICE inline void AttentionScoresThread(long long i, const float* qkv, float* probs,
                                                  int seq, int dim, float scale) {
  const long long b = i / seq;
  const int t = static_cast<int>(i % seq);
  const long long stride = 3LL * dim;
  const float* q = qkv + (b * seq + t) * stride;
  const float* k = qkv + b * seq * stride + dim;
  examples::CausalAttentionRow(q, k, stride, dim, t, seq, scale, probs + i * seq);
}

// Threads: batch * seq * dim. out[b, t, d] = sum over u <= t of
// probs[b, t, u] v[b, u, d].
TFM_HOST_DEVICE inline void AttentionApplyThread(long long i, const float* qkv, const float* probs,
                                                 float* out, int seq, int dim) {
  const long long row = i / dim;
  const int d = static_cast<int>(i % dim);
  const long long b = row / seq;
  const int t = static_cast<int>(row % seq);
  const float* p = probs + row * seq;
  float acc = 0.0f;
  for (int u = 0; u <= t; ++u) {
    acc = MulAdd(acc, p[u], qkv[(b * seq + u) * 3LL * dim + 2LL * dim + d]);
  }
  out[i] = acc;
}

// Threads: batch * seq * seq + batch * seq * dim. Threads
// [0, batch seq seq): dprobs[b, t, u] = dout_t . v_u for u <= t, else 0.
// The rest: dv[b, u, d] = sum over t >= u of probs[b, t, u] dout[b, t, d],
// into the v third of dqkv.
TFM_HOST_DEVICE inline void AttentionBackwardApplyThread(long long i, const float* qkv,
                                                         const float* probs, const float* dout,
                                                         float* dprobs, float* dqkv, int batch,
                                                         int seq, int dim) {
  const long long scores = static_cast<long long>(batch) * seq * seq;
  const long long stride = 3LL * dim;
  if (i < scores) {
    const long long row = i / seq;  // b * seq + t
    const int u = static_cast<int>(i % seq);
    const int t = static_cast<int>(row % seq);
    const long long b = row / seq;
    if (u > t) {
      dprobs[i] = 0.0f;
      return;
    }
    const float* g = dout + row * dim;
    const float* v = qkv + (b * seq + u) * stride + 2LL * dim;
    float acc = 0.0f;
    for (int d = 0; d < dim; ++d) acc = MulAdd(acc, g[d], v[d]);
    dprobs[i] = acc;
  } else if (i < scores + static_cast<long long>(batch) * seq * dim) {
    const long long e = i - scores;
    const long long row = e / dim;  // b * seq + u
    const int d = static_cast<int>(e % dim);
    const long long b = row / seq;
    const int u = static_cast<int>(row % seq);
    float acc = 0.0f;
    for (int t = u; t < seq; ++t) {
      acc = MulAdd(acc, probs[(b * seq + t) * seq + u], dout[(b * seq + t) * dim + d]);
    }
    dqkv[row * stride + 2LL * dim + d] = acc;
  }
}

// Threads: batch * seq. In place, dprobs of row (b, t) becomes the gradient
// of the scaled scores: scale * p_u (dp_u - sum over w of p_w dp_w).
TFM_HOST_DEVICE inline void SoftmaxBackwardThread(long long i, const float* probs, float* dprobs,
                                                  int seq, float scale) {
  const float* p = probs + i * seq;
  float* g = dprobs + i * seq;
  const int t = static_cast<int>(i % seq);
  float dot = 0.0f;
  for (int u = 0; u <= t; ++u) dot = MulAdd(dot, p[u], g[u]);
  for (int u = 0; u <= t; ++u) g[u] = Mul(scale, Mul(p[u], Sub(g[u], dot)));
}

// Threads: 2 * batch * seq * dim. With dscores the score gradient from
// SoftmaxBackwardThread: threads [0, batch seq dim) write dq[b, t, d] = sum
// over u <= t of dscores[b, t, u] k[b, u, d]; the rest dk[b, u, d] = sum
// over t >= u of dscores[b, t, u] q[b, t, d]; into the q and k thirds of
// dqkv.
TFM_HOST_DEVICE inline void AttentionBackwardQkThread(long long i, const float* qkv,
                                                      const float* dscores, float* dqkv, int batch,
                                                      int seq, int dim) {
  const long long elements = static_cast<long long>(batch) * seq * dim;
  const long long stride = 3LL * dim;
  const bool key = i >= elements;
  const long long e = key ? i - elements : i;
  if (e >= elements) return;
  const long long row = e / dim;
  const int d = static_cast<int>(e % dim);
  const long long b = row / seq;
  const int s = static_cast<int>(row % seq);
  float acc = 0.0f;
  if (!key) {
    for (int u = 0; u <= s; ++u) {
      acc = MulAdd(acc, dscores[row * seq + u], qkv[(b * seq + u) * stride + dim + d]);
    }
    dqkv[row * stride + d] = acc;
  } else {
    for (int t = s; t < seq; ++t) {
      acc = MulAdd(acc, dscores[(b * seq + t) * seq + s], qkv[(b * seq + t) * stride + d]);
    }
    dqkv[row * stride + dim + d] = acc;
  }
}

// Threads: rows. Softmax cross-entropy of token row `row` against the next
// token: writes the row's share of the gradient of the mean loss into
// dlogits and returns nothing; the row's loss goes to row_loss.
TFM_HOST_DEVICE inline void SoftmaxXentThread(long long row, const float* logits, const int* tokens,
                                              float* dlogits, float* row_loss, int rows, int seq,
                                              int vocab) {
  const long long b = row / seq;
  const int t = static_cast<int>(row % seq);
  const int label = tokens[b * (seq + 1) + t + 1];
  const float* l = logits + row * vocab;
  float* g = dlogits + row * vocab;
  float max_logit = l[0];
  for (int c = 1; c < vocab; ++c) max_logit = l[c] > max_logit ? l[c] : max_logit;
  float sum = 0.0f;
  for (int c = 0; c < vocab; ++c) sum = Add(sum, Exp(Sub(l[c], max_logit)));
  const float rows_f = static_cast<float>(rows);
  for (int c = 0; c < vocab; ++c) {
    const float p = Div(Exp(Sub(l[c], max_logit)), sum);
    g[c] = Div(c == label ? Sub(p, 1.0f) : p, rows_f);
  }
  row_loss[row] = Sub(Log(sum), Sub(l[label], max_logit));
}

// Threads: 1. loss[0] = mean of row_loss, summed in ascending order.
TFM_HOST_DEVICE inline void MeanLossThread(const float* row_loss, float* loss, int rows) {
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum = Add(sum, row_loss[r]);
  loss[0] = Div(sum, static_cast<float>(rows));
}

// Threads: vocab * dim. dtable[v, d] = sum over token rows holding v, in
// ascending row order, of dx[row, d]. Overwrites.
TFM_HOST_DEVICE inline void EmbedBackwardThread(long long i, const int* tokens, const float* dx,
                                                float* dtable, int rows, int seq, int dim) {
  const int v = static_cast<int>(i / dim);
  const int d = static_cast<int>(i % dim);
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const int token = tokens[static_cast<long long>(r / seq) * (seq + 1) + r % seq];
    if (token == v) acc = Add(acc, dx[static_cast<long long>(r) * dim + d]);
  }
  dtable[i] = acc;
}

// Threads: n. One Adam step per parameter.
TFM_HOST_DEVICE inline void AdamThread(long long i, float* w, float* m, float* v, const float* g,
                                       float lr, float beta1, float beta2, float c1, float c2) {
  AdamStep(&w[i], &m[i], &v[i], g[i], lr, beta1, beta2, c1, c2);
}

}  // namespace tfm

#endif  // STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_OPS_H_
