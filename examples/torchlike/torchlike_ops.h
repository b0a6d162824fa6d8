// The per-thread work of the torchlike example's kernels: one function per
// kernel that computes the output element(s) of global thread index `i`
// (those of the kernels it shares with other examples are in
// examples/common/thread_ops.h).
// The CUDA kernels (torchlike_kernels.cu) call it for their own thread; the
// host twins (torchlike_kernels_host.cc) call it for every thread of the grid,
// except where a comment there says how a cache-friendly loop keeps the same
// order of terms.
//
// Shapes, row-major: rows = batch * seq tokens of one micro-batch; `tokens`
// is [batch, seq + 1] (inputs at [0, seq), targets shifted by one). Every
// sum runs in ascending index order, every rounding is one exact:: operation,
// so the GPU and the fake device compute the same bits.
//
// Pointer tables (the kernels' `const float* const*` and `float* const*`
// parameters) hold one device pointer per entry, as batched-GEMM pointer
// arrays do; the comment of each kernel gives their layout.
//
// All functions are pure apart from their output arguments; a thread writes
// only its own elements, so threads never race.
#ifndef STENSOR_EXAMPLES_TORCHLIKE_TORCHLIKE_OPS_H_
#define STENSOR_EXAMPLES_TORCHLIKE_TORCHLIKE_OPS_H_

// Relative, so that nvcc finds it beside torchlike_kernels.cu too.
#include "../common/exact_math.h"
#include "../common/thread_ops.h"

#define TL_HOST_DEVICE EXACT_HOST_DEVICE

namespace torchlike {

using exact::Add;
using exact::Div;
using exact::Exp;
using exact::Log;
using exact::Mul;
using exact::MulAdd;
using exact::Sqrt;
using exact::Sub;

// ATen's TensorListMetadata for depth 4 (multi_tensor_apply.cuh): fixed
// arrays of the tensors' addresses (params, grads, exp_avg, exp_avg_sq) and
// element counts, and for each block of the launch the tensor (a slot of
// those arrays) and the chunk of it the block updates. Passed by value as a
// kernel parameter; the host refills it from chunk to chunk, so slots past
// the current launch's tensors still hold earlier launches' pointers.
constexpr int kListDepth = 4;
constexpr int kListMaxTensors = 36;  // depth_to_max_tensors[3]
constexpr int kListMaxBlocks = 320;  // depth_to_max_blocks[3]

struct TensorListMetadata {
  void* addresses[kListDepth][kListMaxTensors];
  long long numel_for_tensor[kListMaxTensors];
  unsigned char block_to_tensor[kListMaxBlocks];
  int block_to_chunk[kListMaxBlocks];
  int start_tensor_this_launch;
};

// The embedding row of token row (b, t): a hash of the token and the one
// before it (a bigram hash embedding), `vocab` standing for "no token".
TL_HOST_DEVICE inline int EmbedBucket(const int* tokens, long long row, int seq, int vocab,
                                      int buckets) {
  const long long b = row / seq;
  const int t = static_cast<int>(row % seq);
  const int* s = tokens + b * (seq + 1);
  const unsigned prev = t == 0 ? static_cast<unsigned>(vocab) : static_cast<unsigned>(s[t - 1]);
  const unsigned key = prev * 2654435761u ^ static_cast<unsigned>(s[t]);
  return static_cast<int>(exact::Hash(key) % static_cast<unsigned>(buckets));
}

// Threads: rows * dim. x[row] = table[bucket(row)].
TL_HOST_DEVICE inline void EmbedForwardThread(long long i, const int* tokens, const float* table,
                                              float* x, int seq, int vocab, int buckets, int dim) {
  const long long row = i / dim;
  const int d = static_cast<int>(i % dim);
  const int bucket = EmbedBucket(tokens, row, seq, vocab, buckets);
  x[i] = table[static_cast<long long>(bucket) * dim + d];
}

// Threads: buckets * dim. dtable[bucket, d] = (its old value +) the sum over
// the rows of that bucket, ascending, of dx[row, d].
TL_HOST_DEVICE inline void EmbedBackwardThread(long long i, const int* tokens, const float* dx,
                                               float* dtable, int rows, int seq, int vocab,
                                               int buckets, int dim, int accumulate) {
  const int bucket = static_cast<int>(i / dim);
  const int d = static_cast<int>(i % dim);
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) {
    if (EmbedBucket(tokens, r, seq, vocab, buckets) == bucket) {
      acc = Add(acc, dx[static_cast<long long>(r) * dim + d]);
    }
  }
  dtable[i] = accumulate ? Add(dtable[i], acc) : acc;
}

// Threads: count * seq, one per (instance, query row). Causal attention of
// one head of one sequence (an instance), through tables of `count` entries
// each: in = [q | k | v] (3 count pointers; rows `stride` floats apart),
// out = [o | probs] (2 count pointers; o's rows `out_stride` apart, probs a
// [seq, seq] matrix). probs[t, u] = softmax over u <= t of
// q_t . k_u * scale, zero above the diagonal; o_t = sum_u probs[t, u] v_u.
TL_HOST_DEVICE inline void AttentionForwardThread(long long i, const float* const* in,
                                                  float* const* out, int count, int seq,
                                                  int head_dim, int stride, int out_stride,
                                                  float scale) {
  const int n = static_cast<int>(i / seq);
  const int t = static_cast<int>(i % seq);
  const float* q = in[n] + static_cast<long long>(t) * stride;
  const float* k = in[count + n];
  const float* v = in[2 * count + n];
  float* o = out[n] + static_cast<long long>(t) * out_stride;
  float* p = out[count + n] + static_cast<long long>(t) * seq;
  examples::CausalAttentionRow(q, k, stride, head_dim, t, seq, scale, p);
  for (int d = 0; d < head_dim; ++d) {
    float acc = 0.0f;
    for (int u = 0; u <= t; ++u) {
      acc = MulAdd(acc, p[u], v[static_cast<long long>(u) * stride + d]);
    }
    o[d] = acc;
  }
}

// Threads: count, one per instance. The backward of AttentionForwardThread
// through tables: in = [q | k | v | probs | dout] (5 count pointers; dout's
// rows `out_stride` apart), out = [dq | dk | dv | dscores] (4 count
// pointers; dq, dk, dv rows `stride` apart, dscores a [seq, seq] scratch).
TL_HOST_DEVICE inline void AttentionBackwardThread(long long i, const float* const* in,
                                                   float* const* out, int count, int seq,
                                                   int head_dim, int stride, int out_stride,
                                                   float scale) {
  const int n = static_cast<int>(i);
  const float* q = in[n];
  const float* k = in[count + n];
  const float* v = in[2 * count + n];
  const float* probs = in[3 * count + n];
  const float* dout = in[4 * count + n];
  float* dq = out[n];
  float* dk = out[count + n];
  float* dv = out[2 * count + n];
  float* ds = out[3 * count + n];
  // dprobs, then the gradient of the scaled scores, row by row.
  for (int t = 0; t < seq; ++t) {
    const float* g = dout + static_cast<long long>(t) * out_stride;
    const float* p = probs + static_cast<long long>(t) * seq;
    float* s = ds + static_cast<long long>(t) * seq;
    for (int u = 0; u <= t; ++u) {
      const float* vu = v + static_cast<long long>(u) * stride;
      float acc = 0.0f;
      for (int d = 0; d < head_dim; ++d) acc = MulAdd(acc, g[d], vu[d]);
      s[u] = acc;
    }
    float dot = 0.0f;
    for (int u = 0; u <= t; ++u) dot = MulAdd(dot, p[u], s[u]);
    for (int u = 0; u <= t; ++u) s[u] = Mul(scale, Mul(p[u], Sub(s[u], dot)));
    for (int u = t + 1; u < seq; ++u) s[u] = 0.0f;
  }
  for (int u = 0; u < seq; ++u) {
    for (int d = 0; d < head_dim; ++d) {
      float acc_v = 0.0f, acc_k = 0.0f;
      for (int t = u; t < seq; ++t) {
        acc_v = MulAdd(acc_v, probs[static_cast<long long>(t) * seq + u],
                       dout[static_cast<long long>(t) * out_stride + d]);
        acc_k = MulAdd(acc_k, ds[static_cast<long long>(t) * seq + u],
                       q[static_cast<long long>(t) * stride + d]);
      }
      dv[static_cast<long long>(u) * stride + d] = acc_v;
      dk[static_cast<long long>(u) * stride + d] = acc_k;
    }
  }
  for (int t = 0; t < seq; ++t) {
    for (int d = 0; d < head_dim; ++d) {
      float acc = 0.0f;
      for (int u = 0; u <= t; ++u) {
        acc = MulAdd(acc, ds[static_cast<long long>(t) * seq + u],
                     k[static_cast<long long>(u) * stride + d]);
      }
      dq[static_cast<long long>(t) * stride + d] = acc;
    }
  }
}

// The top-1 expert of a router logits row and its softmax probability.
TL_HOST_DEVICE inline int TopExpert(const float* l, int experts, float* prob) {
  int e = 0;
  for (int k = 1; k < experts; ++k) e = l[k] > l[e] ? k : e;
  float sum = 0.0f;
  for (int k = 0; k < experts; ++k) sum = Add(sum, Exp(Sub(l[k], l[e])));
  *prob = Div(1.0f, sum);  // Exp(0) = 1 exactly
  return e;
}

// Threads: rows. The router: token `row` goes to its top expert with that
// expert's probability as gate, and the kernel writes the token's entries
// of the grouped GEMM's pointer table: token_table[row] = expert_table[e]
// (the expert's w1), token_table[rows + row] = expert_table[experts + e]
// (its w2). A pointer table built on the device.
TL_HOST_DEVICE inline void RouterForwardThread(long long row, const float* logits,
                                               const float* const* expert_table, int* expert_of,
                                               float* gate, const float** token_table, int rows,
                                               int experts) {
  float prob = 0.0f;
  const int e = TopExpert(logits + row * experts, experts, &prob);
  expert_of[row] = e;
  gate[row] = prob;
  token_table[row] = expert_table[e];
  token_table[rows + row] = expert_table[experts + e];
}

// Threads: rows. The grouped GEMM through the router's table: for token t
// with w1 = table[t] [dim, ffn], w2 = table[rows + t] [ffn, dim]:
// hid = relu(x w1), u = hid w2, out = x + gate * u.
TL_HOST_DEVICE inline void MoeForwardThread(long long t, const float* const* table, const float* x,
                                            const float* gate, float* hid, float* u, float* out,
                                            int rows, int dim, int ffn) {
  const float* w1 = table[t];
  const float* w2 = table[rows + t];
  const float* xt = x + t * dim;
  float* ht = hid + t * ffn;
  for (int j = 0; j < ffn; ++j) {
    float acc = 0.0f;
    for (int k = 0; k < dim; ++k) {
      acc = MulAdd(acc, xt[k], w1[static_cast<long long>(k) * ffn + j]);
    }
    ht[j] = exact::Relu(acc);
  }
  for (int d = 0; d < dim; ++d) {
    float acc = 0.0f;
    for (int j = 0; j < ffn; ++j) {
      acc = MulAdd(acc, ht[j], w2[static_cast<long long>(j) * dim + d]);
    }
    u[t * dim + d] = acc;
    out[t * dim + d] = Add(xt[d], Mul(gate[t], acc));
  }
}

// Threads: rows. The backward of MoeForwardThread for token t: dgate =
// dy . u; dhid = relu'(hid) (gate dy) w2^T; dx = dy + dhid w1^T.
TL_HOST_DEVICE inline void MoeBackwardThread(long long t, const float* const* table,
                                             const float* gate, const float* hid, const float* u,
                                             const float* dy, float* dhid, float* dgate, float* dx,
                                             int rows, int dim, int ffn) {
  const float* w1 = table[t];
  const float* w2 = table[rows + t];
  const float* dyt = dy + t * dim;
  float dot = 0.0f;
  for (int d = 0; d < dim; ++d) dot = MulAdd(dot, dyt[d], u[t * dim + d]);
  dgate[t] = dot;
  const float g = gate[t];
  float* dht = dhid + t * ffn;
  for (int j = 0; j < ffn; ++j) {
    float acc = 0.0f;
    const float* w2r = w2 + static_cast<long long>(j) * dim;
    for (int d = 0; d < dim; ++d) acc = MulAdd(acc, Mul(g, dyt[d]), w2r[d]);
    dht[j] = hid[t * ffn + j] > 0.0f ? acc : 0.0f;
  }
  for (int k = 0; k < dim; ++k) {
    float acc = 0.0f;
    const float* w1r = w1 + static_cast<long long>(k) * ffn;
    for (int j = 0; j < ffn; ++j) acc = MulAdd(acc, dht[j], w1r[j]);
    dx[t * dim + k] = Add(dyt[k], acc);
  }
}

// Threads: experts * 2 * dim * ffn. The experts' gradients through a
// host-built table grads = [dw1 of each expert | dw2 of each expert]:
// dw1[e][k][j] = sum over tokens t of e, ascending, of x[t][k] dhid[t][j];
// dw2[e][j][d] = sum of hid[t][j] (gate[t] dy[t][d]); added to the old value
// when `accumulate`.
TL_HOST_DEVICE inline void MoeBackwardParamsThread(long long i, const int* expert_of,
                                                   const float* x, const float* gate,
                                                   const float* hid, const float* dhid,
                                                   const float* dy, float* const* grads, int rows,
                                                   int dim, int ffn, int experts, int accumulate) {
  const long long per = static_cast<long long>(dim) * ffn;
  const bool second = i >= experts * per;
  const long long r = second ? i - experts * per : i;
  const int e = static_cast<int>(r / per);
  const long long at = r % per;
  float acc = 0.0f;
  if (!second) {
    const int k = static_cast<int>(at / ffn);
    const int j = static_cast<int>(at % ffn);
    for (int t = 0; t < rows; ++t) {
      if (expert_of[t] != e) continue;
      acc = MulAdd(acc, x[static_cast<long long>(t) * dim + k],
                   dhid[static_cast<long long>(t) * ffn + j]);
    }
  } else {
    const int j = static_cast<int>(at / dim);
    const int d = static_cast<int>(at % dim);
    for (int t = 0; t < rows; ++t) {
      if (expert_of[t] != e) continue;
      acc = MulAdd(acc, hid[static_cast<long long>(t) * ffn + j],
                   Mul(gate[t], dy[static_cast<long long>(t) * dim + d]));
    }
  }
  float* g = grads[(second ? experts : 0) + e] + at;
  *g = accumulate ? Add(*g, acc) : acc;
}

// Threads: rows. The router logits' gradient from the gate's:
// dlogits[k] = dgate * p_e * ([k == e] - p_k).
TL_HOST_DEVICE inline void RouterBackwardThread(long long row, const float* logits,
                                                const float* dgate, float* dlogits, int experts) {
  const float* l = logits + row * experts;
  float pe = 0.0f;
  const int e = TopExpert(l, experts, &pe);
  const float scale = Mul(dgate[row], pe);
  for (int k = 0; k < experts; ++k) {
    const float pk = Mul(Exp(Sub(l[k], l[e])), pe);
    dlogits[row * experts + k] = Mul(scale, Sub(k == e ? 1.0f : 0.0f, pk));
  }
}

// Threads: rows. Softmax cross-entropy of token row `row` against the next
// token: dlogits = (softmax - onehot) * scale; row_loss = the row's loss.
TL_HOST_DEVICE inline void SoftmaxXentThread(long long row, const float* logits, const int* tokens,
                                             float* dlogits, float* row_loss, int seq, int vocab,
                                             float scale) {
  const long long b = row / seq;
  const int t = static_cast<int>(row % seq);
  const int label = tokens[b * (seq + 1) + t + 1];
  const float* l = logits + row * vocab;
  float* g = dlogits + row * vocab;
  float max_logit = l[0];
  for (int c = 1; c < vocab; ++c) max_logit = l[c] > max_logit ? l[c] : max_logit;
  float sum = 0.0f;
  for (int c = 0; c < vocab; ++c) sum = Add(sum, Exp(Sub(l[c], max_logit)));
  for (int c = 0; c < vocab; ++c) {
    const float p = Div(Exp(Sub(l[c], max_logit)), sum);
    g[c] = Mul(c == label ? Sub(p, 1.0f) : p, scale);
  }
  row_loss[row] = Sub(Log(sum), Sub(l[label], max_logit));
}

// Threads: 1. loss = (loss +) scale * the sum of row_loss, ascending.
TL_HOST_DEVICE inline void LossAccumulateThread(const float* row_loss, float* loss, int rows,
                                                float scale, int accumulate) {
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum = Add(sum, row_loss[r]);
  sum = Mul(sum, scale);
  loss[0] = accumulate ? Add(loss[0], sum) : sum;
}

// Threads: 1. The optimizer's step count, kept on the device as
// capturable=True optimizers keep it, so a replayed graph advances it.
TL_HOST_DEVICE inline void StepIncrementThread(int* step) { step[0] += 1; }

// base^n by squaring, each product one rounding: the same bits everywhere.
TL_HOST_DEVICE inline float PowInt(float base, int n) {
  float result = 1.0f;
  while (n > 0) {
    if (n & 1) result = Mul(result, base);
    base = Mul(base, base);
    n >>= 1;
  }
  return result;
}

// One AdamW update of one element (decoupled weight decay, bias
// corrections from the device step count).
TL_HOST_DEVICE inline void AdamWElement(float* p, const float* g, float* m, float* v, int step,
                                        float lr, float beta1, float beta2, float eps,
                                        float weight_decay) {
  const float bias1 = Sub(1.0f, PowInt(beta1, step));
  const float bias2 = Sub(1.0f, PowInt(beta2, step));
  const float grad = *g;
  const float param = Mul(*p, Sub(1.0f, Mul(lr, weight_decay)));
  const float m1 = Add(Mul(beta1, *m), Mul(Sub(1.0f, beta1), grad));
  const float v1 = Add(Mul(beta2, *v), Mul(Sub(1.0f, beta2), Mul(grad, grad)));
  const float denom = Add(Sqrt(Div(v1, bias2)), eps);
  *m = m1;
  *v = v1;
  *p = Sub(param, Div(Mul(Div(lr, bias1), m1), denom));
}

// Threads: n. The per-parameter AdamW (one launch per tensor).
TL_HOST_DEVICE inline void AdamWThread(long long i, float* p, const float* g, float* m, float* v,
                                       const int* step, float lr, float beta1, float beta2,
                                       float eps, float weight_decay) {
  AdamWElement(p + i, g + i, m + i, v + i, step[0], lr, beta1, beta2, eps, weight_decay);
}

// Element `e` of the chunk that block `block` of a fused launch updates,
// if that element exists (e < chunk_size).
TL_HOST_DEVICE inline void AdamWFusedElement(const TensorListMetadata& tl, int block, long long e,
                                             int chunk_size, const int* step, float lr, float beta1,
                                             float beta2, float eps, float weight_decay) {
  const int tensor = tl.block_to_tensor[block];
  const long long at = static_cast<long long>(tl.block_to_chunk[block]) * chunk_size + e;
  if (at >= tl.numel_for_tensor[tensor]) return;
  float* p = static_cast<float*>(tl.addresses[0][tensor]) + at;
  const float* g = static_cast<const float*>(tl.addresses[1][tensor]) + at;
  float* m = static_cast<float*>(tl.addresses[2][tensor]) + at;
  float* v = static_cast<float*>(tl.addresses[3][tensor]) + at;
  AdamWElement(p, g, m, v, step[0], lr, beta1, beta2, eps, weight_decay);
}

}  // namespace torchlike

#endif  // STENSOR_EXAMPLES_TORCHLIKE_TORCHLIKE_OPS_H_
