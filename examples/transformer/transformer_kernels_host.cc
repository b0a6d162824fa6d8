// Host twins of the CUDA kernels in transformer_kernels.cu, built into a
// module for the fake driver (tests/fakecuda). Each kernel has exactly the
// C++ signature of its CUDA original, so both carry the same mangled name,
// and does the work of the whole grid in one call: most run the per-thread
// function of transformer_ops.h for every thread index, the same code the GPU
// runs. The matrix products (the loops of examples/mlp/mlp_kernels_host.cc)
// and the embedding gradient are reordered for the cache, but every output
// element still receives its terms one at a time in ascending order of the
// reduction index, starting from the same value as on the GPU, so results
// match bit for bit. Unrolled statements such as `a = a + t0 + t1` keep that
// order: C++ adds left to right and, without -ffast-math, gcc may not
// reassociate.
#include <vector>

#include "examples/transformer/transformer_ops.h"
#include "tests/fakecuda/fake_kernel.h"

namespace tfm {

FAKECUDA_KERNEL(init_params, float* w, int n, unsigned seed, float scale) {
  const long long threads = n;
  for (long long i = 0; i < threads; ++i) InitParamsThread(i, w, seed, scale);
}

FAKECUDA_KERNEL(synth_tokens, int* tokens, int batch, int seq, int vocab,
                unsigned seed, int step) {
  const long long threads = static_cast<long long>(batch) * (seq + 1);
  for (long long i = 0; i < threads; ++i)
    SynthTokensThread(i, tokens, seq, vocab, batch, seed, step);
}

FAKECUDA_KERNEL(embed, const int* tokens, const float* table, float* x,
                int rows, int seq, int dim) {
  const long long threads = static_cast<long long>(rows) * dim;
  for (long long i = 0; i < threads; ++i)
    EmbedThread(i, tokens, table, x, seq, dim);
}

FAKECUDA_KERNEL(layernorm_forward, const float* x, const float* gain,
                const float* bias, float* y, float* mean, float* rstd, int rows,
                int dim) {
  const long long threads = rows;
  for (long long i = 0; i < threads; ++i)
    LayerNormForwardThread(i, x, gain, bias, y, mean, rstd, dim);
}

FAKECUDA_KERNEL(layernorm_backward, const float* x, const float* gain,
                const float* mean, const float* rstd, const float* dy,
                float* dx, float* dgain, float* dbias, int rows, int dim) {
  const long long threads = static_cast<long long>(rows) * dim + dim;
  for (long long i = 0; i < threads; ++i)
    LayerNormBackwardThread(i, x, gain, mean, rstd, dy, dx, dgain, dbias, rows,
                            dim);
}

FAKECUDA_KERNEL(attention_scores, const float* qkv, float* probs, int batch,
                int seq, int dim, float scale) {
  const long long threads = static_cast<long long>(batch) * seq;
  for (long long i = 0; i < threads; ++i)
    AttentionScoresThread(i, qkv, probs, seq, dim, scale);
}

FAKECUDA_KERNEL(attention_apply, const float* qkv, const float* probs,
                float* out, int batch, int seq, int dim) {
  const long long threads = static_cast<long long>(batch) * seq * dim;
  for (long long i = 0; i < threads; ++i)
    AttentionApplyThread(i, qkv, probs, out, seq, dim);
}

FAKECUDA_KERNEL(attention_backward_apply, const float* qkv, const float* probs,
                const float* dout, float* dprobs, float* dqkv, int batch,
                int seq, int dim) {
  const long long threads = static_cast<long long>(batch) * seq * (seq + dim);
  for (long long i = 0; i < threads; ++i)
    AttentionBackwardApplyThread(i, qkv, probs, dout, dprobs, dqkv, batch, seq,
                                 dim);
}

FAKECUDA_KERNEL(softmax_backward, const float* probs, float* dprobs, int batch,
                int seq, float scale) {
  const long long threads = static_cast<long long>(batch) * seq;
  for (long long i = 0; i < threads; ++i)
    SoftmaxBackwardThread(i, probs, dprobs, seq, scale);
}

FAKECUDA_KERNEL(attention_backward_qk, const float* qkv, const float* dscores,
                float* dqkv, int batch, int seq, int dim) {
  const long long threads = 2LL * batch * seq * dim;
  for (long long i = 0; i < threads; ++i)
    AttentionBackwardQkThread(i, qkv, dscores, dqkv, batch, seq, dim);
}

FAKECUDA_KERNEL(add, const float* a, const float* b, float* y, int n) {
  const long long threads = n;
  for (long long i = 0; i < threads; ++i) AddThread(i, a, b, y);
}

FAKECUDA_KERNEL(relu_forward, const float* pre, float* post, int n) {
  const long long threads = n;
  for (long long i = 0; i < threads; ++i) ReluForwardThread(i, pre, post);
}

FAKECUDA_KERNEL(relu_backward, const float* pre, float* grad, int n) {
  const long long threads = n;
  for (long long i = 0; i < threads; ++i) ReluBackwardThread(i, pre, grad);
}

FAKECUDA_KERNEL(softmax_xent, const float* logits, const int* tokens,
                float* dlogits, float* row_loss, int rows, int seq, int vocab) {
  const long long threads = rows;
  for (long long i = 0; i < threads; ++i)
    SoftmaxXentThread(i, logits, tokens, dlogits, row_loss, rows, seq, vocab);
}

FAKECUDA_KERNEL(adam, float* w, float* m, float* v, const float* g, float lr,
                float beta1, float beta2, float c1, float c2, int n) {
  const long long threads = n;
  for (long long i = 0; i < threads; ++i)
    AdamThread(i, w, m, v, g, lr, beta1, beta2, c1, c2);
}

FAKECUDA_KERNEL(matmul_forward, const float* x, const float* w, const float* b,
                float* y, int rows, int in, int out) {
  for (int r = 0; r < rows; ++r) {
    float* y_row = y + static_cast<long long>(r) * out;
    for (int j = 0; j < out; ++j) y_row[j] = b[j];
  }
  // k outer so each weight row is read from memory once per launch; four
  // rows per pass to load and store each output row a quarter as often.
  int k = 0;
  for (; k + 4 <= in; k += 4) {
    const float* w0 = w + static_cast<long long>(k) * out;
    const float* w1 = w0 + out;
    const float* w2 = w1 + out;
    const float* w3 = w2 + out;
    for (int r = 0; r < rows; ++r) {
      const float* x_row = x + static_cast<long long>(r) * in + k;
      const float x0 = x_row[0], x1 = x_row[1], x2 = x_row[2], x3 = x_row[3];
      float* y_row = y + static_cast<long long>(r) * out;
      for (int j = 0; j < out; ++j) {
        y_row[j] = y_row[j] + x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j];
      }
    }
  }
  for (; k < in; ++k) {
    const float* w_row = w + static_cast<long long>(k) * out;
    for (int r = 0; r < rows; ++r) {
      const float xk = x[static_cast<long long>(r) * in + k];
      float* y_row = y + static_cast<long long>(r) * out;
      for (int j = 0; j < out; ++j) y_row[j] = y_row[j] + xk * w_row[j];
    }
  }
}

FAKECUDA_KERNEL(matmul_backward_input, const float* dy, const float* w,
                float* dx, int rows, int in, int out) {
  // dx[r][k] sums dy[r][j] * w[k][j] over j. With dy transposed, the rows
  // of sums for one k runs over a contiguous vector while w's row k streams
  // past once, so the innermost loop vectorises without reordering any sum.
  std::vector<float> dy_t(static_cast<size_t>(out) * rows);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < out; ++j) {
      dy_t[static_cast<size_t>(j) * rows + r] =
          dy[static_cast<long long>(r) * out + j];
    }
  }
  std::vector<float> acc(rows);
  for (int k = 0; k < in; ++k) {
    const float* w_row = w + static_cast<long long>(k) * out;
    for (int r = 0; r < rows; ++r) acc[r] = 0.0f;
    int j = 0;
    for (; j + 4 <= out; j += 4) {
      const float w0 = w_row[j], w1 = w_row[j + 1], w2 = w_row[j + 2],
                  w3 = w_row[j + 3];
      const float* t0 = dy_t.data() + static_cast<size_t>(j) * rows;
      const float* t1 = t0 + rows;
      const float* t2 = t1 + rows;
      const float* t3 = t2 + rows;
      for (int r = 0; r < rows; ++r) {
        acc[r] = acc[r] + t0[r] * w0 + t1[r] * w1 + t2[r] * w2 + t3[r] * w3;
      }
    }
    for (; j < out; ++j) {
      const float wj = w_row[j];
      const float* t = dy_t.data() + static_cast<size_t>(j) * rows;
      for (int r = 0; r < rows; ++r) acc[r] = acc[r] + t[r] * wj;
    }
    for (int r = 0; r < rows; ++r) {
      dx[static_cast<long long>(r) * in + k] = acc[r];
    }
  }
}

FAKECUDA_KERNEL(matmul_backward_params, const float* x, const float* dy,
                float* dw, float* db, int rows, int in, int out) {
  for (int k = 0; k < in; ++k) {
    float* dw_row = dw + static_cast<long long>(k) * out;
    for (int j = 0; j < out; ++j) dw_row[j] = 0.0f;
    // Four rows rows per pass: dw's row is loaded and stored once per four
    // terms, which still arrive in ascending r.
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      const float x0 = x[static_cast<long long>(r) * in + k];
      const float x1 = x[static_cast<long long>(r + 1) * in + k];
      const float x2 = x[static_cast<long long>(r + 2) * in + k];
      const float x3 = x[static_cast<long long>(r + 3) * in + k];
      const float* d0 = dy + static_cast<long long>(r) * out;
      const float* d1 = d0 + out;
      const float* d2 = d1 + out;
      const float* d3 = d2 + out;
      for (int j = 0; j < out; ++j) {
        dw_row[j] =
            dw_row[j] + x0 * d0[j] + x1 * d1[j] + x2 * d2[j] + x3 * d3[j];
      }
    }
    for (; r < rows; ++r) {
      const float xr = x[static_cast<long long>(r) * in + k];
      const float* d = dy + static_cast<long long>(r) * out;
      for (int j = 0; j < out; ++j) dw_row[j] = dw_row[j] + xr * d[j];
    }
  }
  for (int j = 0; j < out; ++j) db[j] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* d = dy + static_cast<long long>(r) * out;
    for (int j = 0; j < out; ++j) db[j] = db[j] + d[j];
  }
}

FAKECUDA_KERNEL(mean_loss, const float* row_loss, float* loss, int rows) {
  MeanLossThread(row_loss, loss, rows);
}

FAKECUDA_KERNEL(embed_backward, const int* tokens, const float* dx,
                float* dtable, int rows, int seq, int vocab, int dim) {
  // A scatter over the rows in ascending order adds each element's terms in
  // the order EmbedBackwardThread does, without a pass over all rows for
  // every table element.
  const long long elements = static_cast<long long>(vocab) * dim;
  for (long long i = 0; i < elements; ++i) dtable[i] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const int token =
        tokens[static_cast<long long>(r / seq) * (seq + 1) + r % seq];
    float* out = dtable + static_cast<long long>(token) * dim;
    const float* in = dx + static_cast<long long>(r) * dim;
    for (int d = 0; d < dim; ++d) out[d] = Add(out[d], in[d]);
  }
}

}  // namespace tfm
