// Kernels that reach their buffers through pointer tables in device memory,
// for tests/table_train.cc (host kernels for the fake driver; the names are
// those nvcc gives the same __global__ functions).
#include <cstdint>

#include "tests/fakecuda/fake_kernel.h"

namespace tables {

// ys[i][j] += a * xs[i][j]: reads through one table, writes through another.
FAKECUDA_KERNEL(axpy, float* const* ys, const float* const* xs, float a, int n, int count) {
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < n; ++j) ys[i][j] += a * xs[i][j];
  }
}

// out[j] = sum over i of xs[i][j].
FAKECUDA_KERNEL(sum, const float* const* xs, float* out, int n, int count) {
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int i = 0; i < count; ++i) s += xs[i][j];
    out[j] = s;
  }
}

// Writes a table on the device: table[i] = base + i * stride.
FAKECUDA_KERNEL(build, float** table, float* base, int64_t stride, int count) {
  for (int i = 0; i < count; ++i) table[i] = base + i * stride;
}

// ys[i][j] = ys[i][j] * a + i, through a table of writable pointers.
FAKECUDA_KERNEL(scale, float** ys, float a, int n, int count) {
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < n; ++j) ys[i][j] = ys[i][j] * a + static_cast<float>(i);
  }
}

// A plain kernel: x[j] = x[j] * 0.5 + c (pressure between table uses).
FAKECUDA_KERNEL(touch, float* x, float c, int n) {
  for (int j = 0; j < n; ++j) x[j] = x[j] * 0.5f + c;
}

// Pointer tables in pinned host memory, read by the device.
FAKECUDA_KERNEL(host_table_add, float* const* ys, float v, int n, int count) {
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < n; ++j) ys[i][j] += v;
  }
}

// A table of tables: tables[t][i][j] += 0.5 for t < 2.
FAKECUDA_KERNEL(nested_add, float* const* const* tables, int n, int count) {
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < count; ++i) {
      for (int j = 0; j < n; ++j) tables[t][i][j] += 0.5f;
    }
  }
}

}  // namespace tables
