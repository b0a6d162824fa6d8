// The CUDA kernels that several examples' modules share (parameter
// initialisation, a dense layer's matrix products, elementwise add and
// ReLU), defined once in namespace examples: an example's .cu file includes
// this, so its cubin carries them beside its own kernels.
// layer_kernels_host.cc defines their host twins for the fake driver, with
// the same C++ signatures and so the same mangled names; layer_kernels.h
// launches them. Each kernel is one thread's share of the work, written once
// in thread_ops.h for both.
//
// Deterministic by construction: no atomics, and every output element is
// computed by one thread that reduces in ascending index order. Launch with a
// 1-D grid covering the thread count each kernel's comment in thread_ops.h
// names; surplus threads return at once.
#ifndef STENSOR_EXAMPLES_COMMON_LAYER_KERNELS_CUH_
#define STENSOR_EXAMPLES_COMMON_LAYER_KERNELS_CUH_

// Relative, so that nvcc finds them beside the examples' .cu files.
#include "launch_grid.h"
#include "thread_ops.h"

namespace examples {

__global__ void init_params(float* w, int n, unsigned seed, float scale) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  InitParamsThread(i, w, seed, scale);
}

__global__ void matmul_forward(const float* x, const float* w, const float* b,
                               float* y, int rows, int in, int out) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(rows) * out) return;
  MatmulForwardThread(i, x, w, b, y, in, out);
}

__global__ void matmul_backward_input(const float* dy, const float* w,
                                      float* dx, int rows, int in, int out) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(rows) * in) return;
  MatmulBackwardInputThread(i, dy, w, dx, in, out);
}

__global__ void matmul_backward_params(const float* x, const float* dy,
                                       float* dw, float* db, int rows, int in,
                                       int out, int accumulate) {
  const long long i = GlobalThreadIndex();
  if (i >= static_cast<long long>(in) * out + out) return;
  MatmulBackwardParamsThread(i, x, dy, dw, db, rows, in, out, accumulate);
}

__global__ void add(const float* a, const float* b, float* y, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  AddThread(i, a, b, y);
}

__global__ void relu_forward(const float* pre, float* post, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  ReluForwardThread(i, pre, post);
}

__global__ void relu_backward(const float* pre, float* grad, int n) {
  const long long i = GlobalThreadIndex();
  if (i >= n) return;
  ReluBackwardThread(i, pre, grad);
}

}  // namespace examples

#endif  // STENSOR_EXAMPLES_COMMON_LAYER_KERNELS_CUH_
