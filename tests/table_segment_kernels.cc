// Kernels for tests/table_segments.cc (host kernels for the fake driver; the
// names are those nvcc gives the same __global__ functions).
#include <unistd.h>

#include <cstdint>

#include "tests/fakecuda/fake_kernel.h"

namespace segments {
namespace {

// A kernel's time on a GPU, spent: tens of microseconds.
void Work() {
  volatile float sink = 0;
  for (int i = 0; i < 20000; ++i) sink = sink + 1.0f;
}

}  // namespace

// x[j] = x[j] * 0.5 + a for j < n: writes one tensor of a segment.
FAKECUDA_KERNEL(scale, float* x, int n, float a) {
  Work();
  for (int j = 0; j < n; ++j) x[j] = x[j] * 0.5f + a;
}

// acc[j] += x[j] for j < n: reads one tensor, writes another.
FAKECUDA_KERNEL(sum_into, const float* x, float* acc, int n) {
  Work();
  for (int j = 0; j < n; ++j) acc[j] += x[j];
}

// For each of the k targets of the table: t[i][j] = t[i][j] * 0.5 +
// out[j] * 0.25, then out[j] = out[j] * 0.5 + t[i][j] * 0.25: reads the
// table, reads and writes its targets.
FAKECUDA_KERNEL(through, float* const* t, int k, float* out, int n) {
  Work();
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < n; ++j) {
      t[i][j] = t[i][j] * 0.5f + out[j] * 0.25f;
      out[j] = out[j] * 0.5f + t[i][j] * 0.25f;
    }
  }
}

// p[slot] = target, after a while: rewrites a table through a pointer into
// a tensor placed before it in the same segment, late enough that a
// read-back which does not wait for this kernel reads the old entry.
FAKECUDA_KERNEL(retarget, unsigned long long* p, long long slot, const float* target) {
  usleep(3000);
  p[slot] = reinterpret_cast<unsigned long long>(target);
}

}  // namespace segments
