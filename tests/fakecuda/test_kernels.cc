// Host kernels used by the fake driver's own tests: a spread of parameter
// layouts (alignment padding, structs, templates, extern "C") and kernels
// slow enough to expose missing stream ordering.
#include <chrono>
#include <cstdint>
#include <thread>

#include "tests/fakecuda/fake_kernel.h"

struct Pair {
  int a;
  double b;
};

namespace testk {

FAKECUDA_KERNEL(axpy, float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// char then pointer then short then struct: exercises padding.
FAKECUDA_KERNEL(mixed, char c, double* out, short s, Pair p) {
  out[0] = c;
  out[1] = s;
  out[2] = p.a;
  out[3] = p.b;
}

// Sleeps, then fills: a later operation that is wrongly ordered sees zeros.
FAKECUDA_KERNEL(slow_fill, int* out, int value, int n, int delay_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  for (int i = 0; i < n; ++i) out[i] = value;
}

FAKECUDA_KERNEL(record_geometry, unsigned* out) {
  out[0] = fakecuda::GridDim().x;
  out[1] = fakecuda::GridDim().y;
  out[2] = fakecuda::BlockDim().x;
  out[3] = fakecuda::BlockDim().z;
}

// Reads a device pointer stored in device memory (a pointer the driver
// cannot see in the launch parameters).
FAKECUDA_KERNEL(load_indirect, const float* const* table, float* out) { out[0] = table[0][0]; }

template <typename T>
__attribute__((visibility("default"))) void scale(T* p, T s, int n) {
  for (int i = 0; i < n; ++i) p[i] *= s;
}
FAKECUDA_REGISTER_KERNEL(scale<float>);
FAKECUDA_REGISTER_KERNEL(scale<double>);

}  // namespace testk

FAKECUDA_EXTERN_C_KERNEL(plain_c_kernel, int* out) { out[0] = 42; }
