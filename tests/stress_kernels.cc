// Kernels for tests/stress.cc (host kernels for the fake driver; the names
// are those nvcc gives the same __global__ functions). Integer arithmetic
// only, so the program's host model of every byte is exact. Each reads and
// writes distinct buffers (the program never passes overlapping ranges), so
// the result does not depend on the order of the element loop.
#include <cstdint>

#include "tests/fakecuda/fake_kernel.h"

namespace stress {

// y[i] = y[i] * 2654435761 + x[i] + a: direct pointer parameters.
FAKECUDA_KERNEL(mix, const uint32_t* x, uint32_t* y, uint32_t a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * 2654435761u + x[i] + a;
}

// y[i] = y[i] * 31 + sum over k of xs[k][i]: reads through a const table.
FAKECUDA_KERNEL(gather, const uint32_t* const* xs, uint32_t* y, int count, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t s = y[i] * 31u;
    for (int k = 0; k < count; ++k) s += xs[k][i];
    y[i] = s;
  }
}

// ys[k][i] ^= x[i] + a * (k + 1): writes through a table of plain pointers.
FAKECUDA_KERNEL(scatter, uint32_t* const* ys, const uint32_t* x, uint32_t a, int count, int64_t n) {
  for (int k = 0; k < count; ++k) {
    const uint32_t add = a * static_cast<uint32_t>(k + 1);
    for (int64_t i = 0; i < n; ++i) ys[k][i] ^= x[i] + add;
  }
}

}  // namespace stress
