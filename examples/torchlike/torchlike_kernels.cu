// CUDA kernels of the torchlike example (examples/torchlike/
// torchlike_train.cc), built into a cubin for a real GPU, with the kernels
// it shares with other examples (examples/common/layer_kernels.cuh).
// torchlike_kernels_host.cc defines the same kernels, with the same C++
// signatures and so the same mangled names, as host functions for the fake
// driver. Each kernel is one thread's share of the work, written once in
// torchlike_ops.h for both.
//
// Deterministic by construction: no atomics, and every output element is
// computed by one thread that reduces in ascending index order. Launch with
// a 1-D grid covering the thread count each kernel's comment in
// torchlike_ops.h names (adamw_fused: one block per chunk, as ATen's
// multi_tensor_apply launches); surplus threads return at once.
#include "../common/launch_grid.h"
#include "../common/layer_kernels.cuh"
#include "torchlike_ops.h"

namespace torchlike {

using examples::GlobalThreadIndex;

__global__ void embed_forward(const int* tokens, const float* table, float* x, int rows, int seq,
                              int vocab, int buckets, int dim) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(rows) * dim) return;
  EmbedForwardThread(i, tokens, table, x, seq, vocab, buckets, dim);
}

__global__ void embed_backward(const int* tokens, const float* dx, float* dtable, int rows, int seq,
                               int vocab, int buckets, int dim, int accumulate) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(buckets) * dim) return;
  EmbedBackwardThread(i, tokens, dx, dtable, rows, seq, vocab, buckets, dim, accumulate);
}

__global__ void attention_forward(const float* const* in, float* const* out, int count, int seq,
                                  int head_dim, int stride, int out_stride, float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(count) * seq) return;
  AttentionForwardThread(i, in, out, count, seq, head_dim, stride, out_stride, scale);
}

__global__ void attention_backward(const float* const* in, float* const* out, int count, int seq,
                                   int head_dim, int stride, int out_stride, float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= count) return;
  AttentionBackwardThread(i, in, out, count, seq, head_dim, stride, out_stride, scale);
}

__global__ void router_forward(const float* logits, const float* const* expert_table,
                               int* expert_of, float* gate, const float** token_table, int rows,
                               int experts) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  RouterForwardThread(i, logits, expert_table, expert_of, gate, token_table, rows, experts);
}

__global__ void moe_forward(const float* const* table, const float* x, const float* gate,
                            float* hid, float* u, float* out, int rows, int dim, int ffn) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  MoeForwardThread(i, table, x, gate, hid, u, out, rows, dim, ffn);
}

__global__ void moe_backward(const float* const* table, const float* gate, const float* hid,
                             const float* u, const float* dy, float* dhid, float* dgate, float* dx,
                             int rows, int dim, int ffn) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  MoeBackwardThread(i, table, gate, hid, u, dy, dhid, dgate, dx, rows, dim, ffn);
}

__global__ void moe_backward_params(const int* expert_of, const float* x, const float* gate,
                                    const float* hid, const float* dhid, const float* dy,
                                    float* const* grads, int rows, int dim, int ffn, int experts,
                                    int accumulate) {
  const long long i = GlobalThreadIndex();
  if (i >= 2LL * experts * dim * ffn) return;
  MoeBackwardParamsThread(i, expert_of, x, gate, hid, dhid, dy, grads, rows, dim, ffn, experts,
                          accumulate);
}

__global__ void router_backward(const float* logits, const float* dgate, float* dlogits, int rows,
                                int experts) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  RouterBackwardThread(i, logits, dgate, dlogits, experts);
}

__global__ void softmax_xent(const float* logits, const int* tokens, float* dlogits,
                             float* row_loss, int rows, int seq, int vocab, float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= rows) return;
  SoftmaxXentThread(i, logits, tokens, dlogits, row_loss, seq, vocab, scale);
}

__global__ void loss_accumulate(const float* row_loss, float* loss, int rows, float scale,
                                int accumulate) {
  if (GlobalThreadIndex() >= 1) return;
  LossAccumulateThread(row_loss, loss, rows, scale, accumulate);
}

__global__ void step_increment(int* step) {
  if (GlobalThreadIndex() >= 1) return;
  StepIncrementThread(step);
}

__global__ void adamw(float* p, const float* g, float* m, float* v, const int* step, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  AdamWThread(i, p, g, m, v, step, lr, beta1, beta2, eps, weight_decay);
}

// One block per (tensor, chunk) of the metadata; its threads stride over
// the chunk.
__global__ void adamw_fused(TensorListMetadata tl, int chunk_size, const int* step, float lr,
                            float beta1, float beta2, float eps, float weight_decay) {
  for (long long e = threadIdx.x; e < chunk_size; e += blockDim.x) {
    AdamWFusedElement(tl, static_cast<int>(blockIdx.x), e, chunk_size, step, lr, beta1, beta2, eps,
                      weight_decay);
  }
}

}  // namespace torchlike
