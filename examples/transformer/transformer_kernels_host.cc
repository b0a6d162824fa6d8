// Host twins of the CUDA kernels in transformer_kernels.cu, built into a
// module for the fake driver (tests/fakecuda) together with those of the
// kernels it shares with other examples
// (examples/common/layer_kernels_host.cc). Each kernel has exactly the C++
// signature of its CUDA original, so both carry the same mangled name, and
// does the work of the whole grid in one call: most run the per-thread
// function of transformer_ops.h for every thread index, the same code the GPU
// runs. The embedding gradient is reordered for the cache, but every output
// element still receives its terms one at a time in ascending order of the
// reduction index, starting from the same value as on the GPU, so results
// match bit for bit.
#include "examples/transformer/transformer_ops.h"
#include "tests/fakecuda/fake_kernel.h"

namespace tfm {

FAKECUDA_KERNEL(synth_tokens, int* tokens, int batch, int seq, int vocab, unsigned seed, int step) {
  const long long threads = static_cast<long long>(batch) * (seq + 1);
  for (long long i = 0; i < threads; ++i)
    SynthTokensThread(i, tokens, seq, vocab, batch, seed, step);
}

FAKECUDA_KERNEL(embed, const int* tokens, const float* table, float* x, int rows, int seq,
                int dim) {
  const long long threads = static_cast<long long>(rows) * dim;
  for (long long i = 0; i < threads; ++i) EmbedThread(i, tokens, table, x, seq, dim);
}

FAKECUDA_KERNEL(layernorm_forward, const float* x, const float* gain, const float* bias, float* y,
                float* mean, float* rstd, int rows, int dim) {
  const long long threads = rows;
  for (long long i = 0; i < threads; ++i)
    LayerNormForwardThread(i, x, gain, bias, y, mean, rstd, dim);
}

FAKECUDA_KERNEL(layernorm_backward, const float* x, const float* gain, const float* mean,
                const float* rstd, const float* dy, float* dx, float* dgain, float* dbias, int rows,
                int dim) {
  const long long threads = static_cast<long long>(rows) * dim + dim;
  for (long long i = 0; i < threads; ++i)
    LayerNormBackwardThread(i, x, gain, mean, rstd, dy, dx, dgain, dbias, rows, dim);
}

FAKECUDA_KERNEL(attention_scores, const float* qkv, float* probs, int batch, int seq, int dim,
                float scale) {
  const long long threads = static_cast<long long>(batch) * seq;
  for (long long i = 0; i < threads; ++i) AttentionScoresThread(i, qkv, probs, seq, dim, scale);
}

FAKECUDA_KERNEL(attention_apply, const float* qkv, const float* probs, float* out, int batch,
                int seq, int dim) {
  const long long threads = static_cast<long long>(batch) * seq * dim;
  for (long long i = 0; i < threads; ++i) AttentionApplyThread(i, qkv, probs, out, seq, dim);
}

FAKECUDA_KERNEL(attention_backward_apply, const float* qkv, const float* probs, const float* dout,
                float* dprobs, float* dqkv, int batch, int seq, int dim) {
  const long long threads = static_cast<long long>(batch) * seq * (seq + dim);
  for (long long i = 0; i < threads; ++i)
    AttentionBackwardApplyThread(i, qkv, probs, dout, dprobs, dqkv, batch, seq, dim);
}

FAKECUDA_KERNEL(softmax_backward, const float* probs, float* dprobs, int batch, int seq,
                float scale) {
  const long long threads = static_cast<long long>(batch) * seq;
  for (long long i = 0; i < threads; ++i) SoftmaxBackwardThread(i, probs, dprobs, seq, scale);
}

FAKECUDA_KERNEL(attention_backward_qk, const float* qkv, const float* dscores, float* dqkv,
                int batch, int seq, int dim) {
  const long long threads = 2LL * batch * seq * dim;
  for (long long i = 0; i < threads; ++i)
    AttentionBackwardQkThread(i, qkv, dscores, dqkv, batch, seq, dim);
}

FAKECUDA_KERNEL(softmax_xent, const float* logits, const int* tokens, float* dlogits,
                float* row_loss, int rows, int seq, int vocab) {
  const long long threads = rows;
  for (long long i = 0; i < threads; ++i)
    SoftmaxXentThread(i, logits, tokens, dlogits, row_loss, rows, seq, vocab);
}

FAKECUDA_KERNEL(adam, float* w, float* m, float* v, const float* g, float lr, float beta1,
                float beta2, float c1, float c2, int n) {
  const long long threads = n;
  for (long long i = 0; i < threads; ++i) AdamThread(i, w, m, v, g, lr, beta1, beta2, c1, c2);
}

FAKECUDA_KERNEL(mean_loss, const float* row_loss, float* loss, int rows) {
  MeanLossThread(row_loss, loss, rows);
}

FAKECUDA_KERNEL(embed_backward, const int* tokens, const float* dx, float* dtable, int rows,
                int seq, int vocab, int dim) {
  // A scatter over the rows in ascending order adds each element's terms in
  // the order EmbedBackwardThread does, without a pass over all rows for
  // every table element.
  const long long elements = static_cast<long long>(vocab) * dim;
  for (long long i = 0; i < elements; ++i) dtable[i] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const int token = tokens[static_cast<long long>(r / seq) * (seq + 1) + r % seq];
    float* out = dtable + static_cast<long long>(token) * dim;
    const float* in = dx + static_cast<long long>(r) * dim;
    for (int d = 0; d < dim; ++d) out[d] = Add(out[d], in[d]);
  }
}

}  // namespace tfm
