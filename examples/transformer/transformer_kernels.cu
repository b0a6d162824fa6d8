// CUDA kernels of the transformer example
// (examples/transformer/transformer_train.cc), built into a cubin for a real
// GPU, with the kernels it shares with other examples
// (examples/common/layer_kernels.cuh). transformer_kernels_host.cc defines
// the same kernels, with the same C++ signatures and so the same mangled
// names, as host functions for the fake driver. Each kernel is one thread's
// share of the work, written once in transformer_ops.h for both.
//
// Deterministic by construction: no atomics, and every output element is
// computed by one thread that reduces in ascending index order. Launch with a
// 1-D grid covering the thread count each kernel's comment in
// transformer_ops.h names; surplus threads return at once.
#include "../common/launch_grid.h"
#include "../common/layer_kernels.cuh"
#include "transformer_ops.h"

namespace tfm {

using examples::GlobalThreadIndex;

__global__ void synth_tokens(int* tokens, int batch, int seq, int vocab, unsigned seed, int step) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * (seq + 1)) return;
  SynthTokensThread(i, tokens, seq, vocab, batch, seed, step);
}

__global__ void embed(const int* tokens, const float* table, float* x, int rows, int seq, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(rows) * dim) return;
  EmbedThread(i, tokens, table, x, seq, dim);
}

__global__ void layernorm_forward(const float* x, const float* gain, const float* bias, float* y,
                                  float* mean, float* rstd, int rows, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  LayerNormForwardThread(i, x, gain, bias, y, mean, rstd, dim);
}

__global__ void layernorm_backward(const float* x, const float* gain, const float* mean,
                                   const float* rstd, const float* dy, float* dx, float* dgain,
                                   float* dbias, int rows, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(rows) * dim + dim) return;
  LayerNormBackwardThread(i, x, gain, mean, rstd, dy, dx, dgain, dbias, rows, dim);
}

__global__ void attention_scores(const float* qkv, float* probs, int batch, int seq, int dim,
                                 float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * seq) return;
  AttentionScoresThread(i, qkv, probs, seq, dim, scale);
}

__global__ void attention_apply(const float* qkv, const float* probs, float* out, int batch,
                                int seq, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * seq * dim) return;
  AttentionApplyThread(i, qkv, probs, out, seq, dim);
}

__global__ void attention_backward_apply(const float* qkv, const float* probs, const float* dout,
                                         float* dprobs, float* dqkv, int batch, int seq, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * seq * (seq + dim)) return;
  AttentionBackwardApplyThread(i, qkv, probs, dout, dprobs, dqkv, batch, seq, dim);
}

__global__ void softmax_backward(const float* probs, float* dprobs, int batch, int seq,
                                 float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(batch) * seq) return;
  SoftmaxBackwardThread(i, probs, dprobs, seq, scale);
}

__global__ void attention_backward_qk(const float* qkv, const float* dscores, float* dqkv,
                                      int batch, int seq, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= 2LL * batch * seq * dim) return;
  AttentionBackwardQkThread(i, qkv, dscores, dqkv, batch, seq, dim);
}

__global__ void softmax_xent(const float* logits, const int* tokens, float* dlogits,
                             float* row_loss, int rows, int seq, int vocab) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  SoftmaxXentThread(i, logits, tokens, dlogits, row_loss, rows, seq, vocab);
}

__global__ void mean_loss(const float* row_loss, float* loss, int rows) {
  const long long i = GlobalThreadIndex();
  if (i >= 1) return;
  MeanLossThread(row_loss, loss, rows);
}

__global__ void embed_backward(const int* tokens, const float* dx, float* dtable, int rows, int seq,
                               int vocab, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(vocab) * dim) return;
  EmbedBackwardThread(i, tokens, dx, dtable, rows, seq, dim);
}

__global__ void adam(float* w, float* m, float* v, const float* g, float lr, float beta1,
                     float beta2, float c1, float c2, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  AdamThread(i, w, m, v, g, lr, beta1, beta2, c1, c2);
}

}  // namespace tfm
