// Kernels for tests/table_sources.cc, table_writers.cc and table_regrow.cc
// (host kernels for the fake driver; the names are those nvcc gives the
// same __global__ functions).
#include <cstdint>

#include "tests/fakecuda/fake_kernel.h"

namespace sources {

// (*t)[j] += 1 for j < n: writes the buffer the table's first entry names.
FAKECUDA_KERNEL(add_through, float* const* t, int n) {
  for (int j = 0; j < n; ++j) t[0][j] += 1.0f;
}

// acc[j] += x[j] for j < n: reads a buffer (pressure under a cap).
FAKECUDA_KERNEL(sum_into, const float* x, float* acc, int n) {
  for (int j = 0; j < n; ++j) acc[j] += x[j];
}

// *slot = b, through device-mapped host memory: the kernel only reads b's
// address, it writes no device buffer.
FAKECUDA_KERNEL(store_ptr, uint64_t* slot, const float* b) {
  *slot = reinterpret_cast<uint64_t>(b);
}

// *slots[0] = b: writes host memory through a pointer the kernel reads from
// a device table, not from its parameters.
FAKECUDA_KERNEL(store_through, uint64_t* const* slots, const float* b) {
  *slots[0] = reinterpret_cast<uint64_t>(b);
}

// dst[i] = src[i] for i < k: a table built on the device from another, as a
// mixture of experts' router builds its per-token table.
FAKECUDA_KERNEL(copy_table, const float* const* src, float** dst, int k) {
  for (int i = 0; i < k; ++i) dst[i] = const_cast<float*>(src[i]);
}

// t[i][j] += 1 for i < k, j < n: writes every target of the table.
FAKECUDA_KERNEL(add_all, float* const* t, int k, int n) {
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < n; ++j) t[i][j] += 1.0f;
  }
}

}  // namespace sources
