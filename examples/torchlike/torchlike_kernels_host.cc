// Host twins of the CUDA kernels in torchlike_kernels.cu, built into a module
// for the fake driver (tests/fakecuda) together with those of the kernels it
// shares with other examples (examples/common/layer_kernels_host.cc). Each
// kernel has exactly the C++ signature of its CUDA original, so both carry
// the same mangled name, and does the work of the whole grid in one call:
// most run the per-thread function of torchlike_ops.h for every thread index,
// the same code the GPU runs. The gradients that sum over tokens (embedding,
// experts) are reordered for the cache, but every output element still
// receives its terms one at a time in ascending order, from the same start,
// and is combined with its old value by the same one addition, so results
// match bit for bit.
#include <vector>

#include "examples/torchlike/torchlike_ops.h"
#include "tests/fakecuda/fake_kernel.h"

namespace torchlike {

FAKECUDA_KERNEL(embed_forward, const int* tokens, const float* table, float* x, int rows, int seq,
                int vocab, int buckets, int dim) {
  const long long threads = static_cast<long long>(rows) * dim;
  for (long long i = 0; i < threads; ++i)
    EmbedForwardThread(i, tokens, table, x, seq, vocab, buckets, dim);
}

FAKECUDA_KERNEL(embed_backward, const int* tokens, const float* dx, float* dtable, int rows,
                int seq, int vocab, int buckets, int dim, int accumulate) {
  // Per bucket, its rows in ascending order (most buckets have none).
  std::vector<int> bucket_of(rows);
  for (int r = 0; r < rows; ++r) bucket_of[r] = EmbedBucket(tokens, r, seq, vocab, buckets);
  std::vector<int> first(buckets, -1), next(rows, -1), last(buckets, -1);
  for (int r = 0; r < rows; ++r) {
    const int b = bucket_of[r];
    if (first[b] < 0)
      first[b] = r;
    else
      next[last[b]] = r;
    last[b] = r;
  }
  for (int b = 0; b < buckets; ++b) {
    float* out = dtable + static_cast<long long>(b) * dim;
    for (int d = 0; d < dim; ++d) {
      float acc = 0.0f;
      for (int r = first[b]; r >= 0; r = next[r])
        acc = Add(acc, dx[static_cast<long long>(r) * dim + d]);
      out[d] = accumulate ? Add(out[d], acc) : acc;
    }
  }
}

FAKECUDA_KERNEL(attention_forward, const float* const* in, float* const* out, int count, int seq,
                int head_dim, int stride, int out_stride, float scale) {
  const long long threads = static_cast<long long>(count) * seq;
  for (long long i = 0; i < threads; ++i)
    AttentionForwardThread(i, in, out, count, seq, head_dim, stride, out_stride, scale);
}

FAKECUDA_KERNEL(attention_backward, const float* const* in, float* const* out, int count, int seq,
                int head_dim, int stride, int out_stride, float scale) {
  for (long long i = 0; i < count; ++i)
    AttentionBackwardThread(i, in, out, count, seq, head_dim, stride, out_stride, scale);
}

FAKECUDA_KERNEL(router_forward, const float* logits, const float* const* expert_table,
                int* expert_of, float* gate, const float** token_table, int rows, int experts) {
  for (long long i = 0; i < rows; ++i)
    RouterForwardThread(i, logits, expert_table, expert_of, gate, token_table, rows, experts);
}

FAKECUDA_KERNEL(moe_forward, const float* const* table, const float* x, const float* gate,
                float* hid, float* u, float* out, int rows, int dim, int ffn) {
  for (long long i = 0; i < rows; ++i)
    MoeForwardThread(i, table, x, gate, hid, u, out, rows, dim, ffn);
}

FAKECUDA_KERNEL(moe_backward, const float* const* table, const float* gate, const float* hid,
                const float* u, const float* dy, float* dhid, float* dgate, float* dx, int rows,
                int dim, int ffn) {
  for (long long i = 0; i < rows; ++i)
    MoeBackwardThread(i, table, gate, hid, u, dy, dhid, dgate, dx, rows, dim, ffn);
}

// Per expert, its tokens in ascending order, each adding its terms to every
// element of the expert's sums: the order MoeBackwardParamsThread sums in.
FAKECUDA_KERNEL(moe_backward_params, const int* expert_of, const float* x, const float* gate,
                const float* hid, const float* dhid, const float* dy, float* const* grads, int rows,
                int dim, int ffn, int experts, int accumulate) {
  const size_t per = static_cast<size_t>(dim) * ffn;
  std::vector<float> s1(per), s2(per), gdy(dim);
  for (int e = 0; e < experts; ++e) {
    for (size_t i = 0; i < per; ++i) s1[i] = s2[i] = 0.0f;
    for (int t = 0; t < rows; ++t) {
      if (expert_of[t] != e) continue;
      const float* xt = x + static_cast<long long>(t) * dim;
      const float* dht = dhid + static_cast<long long>(t) * ffn;
      const float* ht = hid + static_cast<long long>(t) * ffn;
      for (int d = 0; d < dim; ++d) gdy[d] = Mul(gate[t], dy[static_cast<long long>(t) * dim + d]);
      for (int k = 0; k < dim; ++k) {
        float* row = s1.data() + static_cast<size_t>(k) * ffn;
        for (int j = 0; j < ffn; ++j) row[j] = MulAdd(row[j], xt[k], dht[j]);
      }
      for (int j = 0; j < ffn; ++j) {
        float* row = s2.data() + static_cast<size_t>(j) * dim;
        for (int d = 0; d < dim; ++d) row[d] = MulAdd(row[d], ht[j], gdy[d]);
      }
    }
    float* g1 = grads[e];
    float* g2 = grads[experts + e];
    for (size_t i = 0; i < per; ++i) {
      g1[i] = accumulate ? Add(g1[i], s1[i]) : s1[i];
      g2[i] = accumulate ? Add(g2[i], s2[i]) : s2[i];
    }
  }
}

FAKECUDA_KERNEL(router_backward, const float* logits, const float* dgate, float* dlogits, int rows,
                int experts) {
  for (long long i = 0; i < rows; ++i) RouterBackwardThread(i, logits, dgate, dlogits, experts);
}

FAKECUDA_KERNEL(softmax_xent, const float* logits, const int* tokens, float* dlogits,
                float* row_loss, int rows, int seq, int vocab, float scale) {
  for (long long i = 0; i < rows; ++i)
    SoftmaxXentThread(i, logits, tokens, dlogits, row_loss, seq, vocab, scale);
}

FAKECUDA_KERNEL(loss_accumulate, const float* row_loss, float* loss, int rows, float scale,
                int accumulate) {
  LossAccumulateThread(row_loss, loss, rows, scale, accumulate);
}

FAKECUDA_KERNEL(step_increment, int* step) { StepIncrementThread(step); }

FAKECUDA_KERNEL(adamw, float* p, const float* g, float* m, float* v, const int* step, float lr,
                float beta1, float beta2, float eps, float weight_decay, int n) {
  for (long long i = 0; i < n; ++i)
    AdamWThread(i, p, g, m, v, step, lr, beta1, beta2, eps, weight_decay);
}

FAKECUDA_KERNEL(adamw_fused, TensorListMetadata tl, int chunk_size, const int* step, float lr,
                float beta1, float beta2, float eps, float weight_decay) {
  const int blocks = static_cast<int>(fakecuda::GridDim().x);
  for (int block = 0; block < blocks; ++block) {
    for (long long e = 0; e < chunk_size; ++e) {
      AdamWFusedElement(tl, block, e, chunk_size, step, lr, beta1, beta2, eps, weight_decay);
    }
  }
}

}  // namespace torchlike
