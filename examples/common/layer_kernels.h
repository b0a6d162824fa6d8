// Typed launchers of the kernels in layer_kernels.cuh (and their host twins,
// layer_kernels_host.cc), for the training programs whose modules carry
// them. Each mirrors its kernel's C++ signature (CUdeviceptr standing for a
// pointer) so no call can pass a parameter of the wrong size; kernels are
// looked up by their mangled names, which encode those signatures. An
// example's own launcher class derives from this one and adds its kernels.
//
// Thread-safety: launches go to the one stream given at construction; use
// from one thread at a time, as a stream is.
#ifndef STENSOR_EXAMPLES_COMMON_LAYER_KERNELS_H_
#define STENSOR_EXAMPLES_COMMON_LAYER_KERNELS_H_

#include <cuda.h>

namespace examples {

class LayerKernels {
 public:
  using Ptr = CUdeviceptr;

  // Looks the kernels up in `module` (exiting, named, if one is missing);
  // all launch on `stream`.
  LayerKernels(CUmodule module, CUstream stream);

  void InitParams(Ptr w, int n, unsigned seed, float scale) const;
  void MatmulForward(Ptr x, Ptr w, Ptr b, Ptr y, int rows, int in, int out) const;
  void MatmulBackwardInput(Ptr dy, Ptr w, Ptr dx, int rows, int in, int out) const;
  // Adds the gradients to dw and db when `accumulate`, else overwrites.
  void MatmulBackwardParams(Ptr x, Ptr dy, Ptr dw, Ptr db, int rows, int in, int out,
                            int accumulate) const;
  void AddVectors(Ptr a, Ptr b, Ptr y, int n) const;
  void ReluForward(Ptr pre, Ptr post, int n) const;
  void ReluBackward(Ptr pre, Ptr grad, int n) const;

  CUstream stream() const { return stream_; }

 private:
  // One thread per element on stream_.
  void Launch(CUfunction function, const char* name, long long threads, void** args) const;

  CUfunction init_params_, matmul_forward_, matmul_backward_input_, matmul_backward_params_, add_,
      relu_forward_, relu_backward_;
  CUstream stream_;
};

}  // namespace examples

#endif  // STENSOR_EXAMPLES_COMMON_LAYER_KERNELS_H_
