// Host twins of the CUDA kernels in mlp_kernels.cu, built into a module for
// the fake driver (tests/fakecuda). Each kernel has exactly the C++ signature
// of its CUDA original, so both carry the same mangled name, and does the work
// of the whole grid in one call.
//
// Loops are ordered for the cache and for gcc's vectoriser (rows of the
// weight matrix stream through the innermost loop), but every output element
// still receives its terms one at a time in ascending order of the reduction
// index, starting from the same value as on the GPU, so results match the
// CUDA kernels bit for bit. Unrolled statements such as
// `a = a + t0 + t1` keep that order: C++ adds left to right and, without
// -ffast-math, gcc may not reassociate.
#include <vector>

#include "examples/mlp/mlp_math.h"
#include "tests/fakecuda/fake_kernel.h"

namespace mlp {

FAKECUDA_KERNEL(init_params, float* w, int n, unsigned seed, float scale) {
  for (int i = 0; i < n; ++i) w[i] = InitialParam(seed, i, scale);
}

FAKECUDA_KERNEL(synth_shard, float* data, int* labels, int first_sample,
                int count, int features, int classes, unsigned seed,
                float noise) {
  for (int row = 0; row < count; ++row) {
    const unsigned sample = static_cast<unsigned>(first_sample + row);
    float* out = data + static_cast<long long>(row) * features;
    for (int f = 0; f < features; ++f) {
      out[f] = SampleFeature(seed, sample, f, features, classes, noise);
    }
    labels[row] = SampleLabel(seed, sample, classes);
  }
}

FAKECUDA_KERNEL(gather_batch, const float* data, const int* labels, float* x,
                int* y, int first, int batch, int features) {
  const float* src = data + static_cast<long long>(first) * features;
  const long long n = static_cast<long long>(batch) * features;
  for (long long i = 0; i < n; ++i) x[i] = src[i];
  for (int row = 0; row < batch; ++row) y[row] = labels[first + row];
}

FAKECUDA_KERNEL(linear_forward, const float* x, const float* w, const float* b,
                float* y, int batch, int in, int out) {
  for (int r = 0; r < batch; ++r) {
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
    for (int r = 0; r < batch; ++r) {
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
    for (int r = 0; r < batch; ++r) {
      const float xk = x[static_cast<long long>(r) * in + k];
      float* y_row = y + static_cast<long long>(r) * out;
      for (int j = 0; j < out; ++j) y_row[j] = y_row[j] + xk * w_row[j];
    }
  }
}

FAKECUDA_KERNEL(relu_forward, const float* pre, float* post, int n) {
  for (int i = 0; i < n; ++i) post[i] = Relu(pre[i]);
}

FAKECUDA_KERNEL(softmax_xent, const float* logits, const int* labels,
                float* dlogits, float* sample_loss, int batch, int classes) {
  for (int r = 0; r < batch; ++r) {
    const long long offset = static_cast<long long>(r) * classes;
    sample_loss[r] = SoftmaxXentRow(logits + offset, labels[r],
                                    dlogits + offset, classes, batch);
  }
}

FAKECUDA_KERNEL(mean_loss, const float* sample_loss, float* loss, int batch) {
  float sum = 0.0f;
  for (int i = 0; i < batch; ++i) sum = Add(sum, sample_loss[i]);
  loss[0] = Div(sum, static_cast<float>(batch));
}

FAKECUDA_KERNEL(linear_backward_input, const float* dy, const float* w,
                float* dx, int batch, int in, int out) {
  // dx[r][k] sums dy[r][j] * w[k][j] over j. With dy transposed, the batch
  // of sums for one k runs over a contiguous vector while w's row k streams
  // past once, so the innermost loop vectorises without reordering any sum.
  std::vector<float> dy_t(static_cast<size_t>(out) * batch);
  for (int r = 0; r < batch; ++r) {
    for (int j = 0; j < out; ++j) {
      dy_t[static_cast<size_t>(j) * batch + r] =
          dy[static_cast<long long>(r) * out + j];
    }
  }
  std::vector<float> acc(batch);
  for (int k = 0; k < in; ++k) {
    const float* w_row = w + static_cast<long long>(k) * out;
    for (int r = 0; r < batch; ++r) acc[r] = 0.0f;
    int j = 0;
    for (; j + 4 <= out; j += 4) {
      const float w0 = w_row[j], w1 = w_row[j + 1], w2 = w_row[j + 2],
                  w3 = w_row[j + 3];
      const float* t0 = dy_t.data() + static_cast<size_t>(j) * batch;
      const float* t1 = t0 + batch;
      const float* t2 = t1 + batch;
      const float* t3 = t2 + batch;
      for (int r = 0; r < batch; ++r) {
        acc[r] = acc[r] + t0[r] * w0 + t1[r] * w1 + t2[r] * w2 + t3[r] * w3;
      }
    }
    for (; j < out; ++j) {
      const float wj = w_row[j];
      const float* t = dy_t.data() + static_cast<size_t>(j) * batch;
      for (int r = 0; r < batch; ++r) acc[r] = acc[r] + t[r] * wj;
    }
    for (int r = 0; r < batch; ++r) {
      dx[static_cast<long long>(r) * in + k] = acc[r];
    }
  }
}

FAKECUDA_KERNEL(linear_backward_params, const float* x, const float* dy,
                float* dw, float* db, int batch, int in, int out) {
  for (int k = 0; k < in; ++k) {
    float* dw_row = dw + static_cast<long long>(k) * out;
    for (int j = 0; j < out; ++j) dw_row[j] = 0.0f;
    // Four batch rows per pass: dw's row is loaded and stored once per four
    // terms, which still arrive in ascending r.
    int r = 0;
    for (; r + 4 <= batch; r += 4) {
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
    for (; r < batch; ++r) {
      const float xr = x[static_cast<long long>(r) * in + k];
      const float* d = dy + static_cast<long long>(r) * out;
      for (int j = 0; j < out; ++j) dw_row[j] = dw_row[j] + xr * d[j];
    }
  }
  for (int j = 0; j < out; ++j) db[j] = 0.0f;
  for (int r = 0; r < batch; ++r) {
    const float* d = dy + static_cast<long long>(r) * out;
    for (int j = 0; j < out; ++j) db[j] = db[j] + d[j];
  }
}

FAKECUDA_KERNEL(relu_backward, const float* pre, float* grad, int n) {
  for (int i = 0; i < n; ++i) {
    if (!(pre[i] > 0.0f)) grad[i] = 0.0f;
  }
}

FAKECUDA_KERNEL(sgd_momentum, float* w, float* v, const float* g, float lr,
                float momentum, int n) {
  for (int i = 0; i < n; ++i) SgdMomentumStep(&w[i], &v[i], g[i], lr, momentum);
}

}  // namespace mlp
