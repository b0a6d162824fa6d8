// The matrix products of the examples' host kernels (the fake device's
// twins of their CUDA kernels: examples/mlp/mlp_kernels_host.cc,
// examples/transformer/transformer_kernels_host.cc), for row-major x [rows,
// in], w [in, out], y [rows, out].
//
// The loops are ordered for the cache and for gcc's vectoriser (rows of the
// weight matrix stream through the innermost loop), but every output element
// still receives its terms one at a time in ascending order of the reduction
// index, starting from the same value as on the GPU, so results match the
// CUDA kernels bit for bit. Unrolled statements such as `a = a + t0 + t1`
// keep that order: C++ adds left to right and, without -ffast-math, gcc may
// not reassociate; the including target must pass -ffp-contract=off (see
// exact_math.h).
//
// Pure functions of their arguments; thread-safe for distinct outputs.
#ifndef STENSOR_EXAMPLES_COMMON_HOST_MATMUL_H_
#define STENSOR_EXAMPLES_COMMON_HOST_MATMUL_H_

#include <cstddef>
#include <vector>

namespace exact {

// y = x w + b: y[r][j] starts from b[j] and receives x[r][k] * w[k][j] in
// ascending k.
inline void MatmulForward(const float* x, const float* w, const float* b, float* y, int rows,
                          int in, int out) {
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

// dx = dy w^T: dx[r][k] starts from 0 and receives dy[r][j] * w[k][j] in
// ascending j.
inline void MatmulBackwardInput(const float* dy, const float* w, float* dx, int rows, int in,
                                int out) {
  // With dy transposed, the sums for one k run over a contiguous vector while
  // w's row k streams past once, so the innermost loop vectorises without
  // reordering any sum.
  std::vector<float> dy_t(static_cast<size_t>(out) * rows);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < out; ++j) {
      dy_t[static_cast<size_t>(j) * rows + r] = dy[static_cast<long long>(r) * out + j];
    }
  }
  std::vector<float> acc(rows);
  for (int k = 0; k < in; ++k) {
    const float* w_row = w + static_cast<long long>(k) * out;
    for (int r = 0; r < rows; ++r) acc[r] = 0.0f;
    int j = 0;
    for (; j + 4 <= out; j += 4) {
      const float w0 = w_row[j], w1 = w_row[j + 1], w2 = w_row[j + 2], w3 = w_row[j + 3];
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

// dw = x^T dy and db = the column sums of dy, each element from 0 over the
// rows in ascending order. Overwrites.
inline void MatmulBackwardParams(const float* x, const float* dy, float* dw, float* db, int rows,
                                 int in, int out) {
  for (int k = 0; k < in; ++k) {
    float* dw_row = dw + static_cast<long long>(k) * out;
    for (int j = 0; j < out; ++j) dw_row[j] = 0.0f;
    // Four rows per pass: dw's row is loaded and stored once per four
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
        dw_row[j] = dw_row[j] + x0 * d0[j] + x1 * d1[j] + x2 * d2[j] + x3 * d3[j];
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

}  // namespace exact

#endif  // STENSOR_EXAMPLES_COMMON_HOST_MATMUL_H_
