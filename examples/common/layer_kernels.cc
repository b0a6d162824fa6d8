#include "examples/common/layer_kernels.h"

#include "examples/common/example_program.h"

namespace examples {

LayerKernels::LayerKernels(CUmodule module, CUstream stream) : stream_(stream) {
  init_params_ = GetKernel(module, "_ZN8examples11init_paramsEPfijf");
  matmul_forward_ = GetKernel(module, "_ZN8examples14matmul_forwardEPKfS1_S1_Pfiii");
  matmul_backward_input_ = GetKernel(module, "_ZN8examples21matmul_backward_inputEPKfS1_Pfiii");
  matmul_backward_params_ =
      GetKernel(module, "_ZN8examples22matmul_backward_paramsEPKfS1_PfS2_iiii");
  add_ = GetKernel(module, "_ZN8examples3addEPKfS1_Pfi");
  relu_forward_ = GetKernel(module, "_ZN8examples12relu_forwardEPKfPfi");
  relu_backward_ = GetKernel(module, "_ZN8examples13relu_backwardEPKfPfi");
}

void LayerKernels::InitParams(Ptr w, int n, unsigned seed, float scale) const {
  void* args[] = {&w, &n, &seed, &scale};
  Launch(init_params_, "init_params", n, args);
}

void LayerKernels::MatmulForward(Ptr x, Ptr w, Ptr b, Ptr y, int rows, int in, int out) const {
  void* args[] = {&x, &w, &b, &y, &rows, &in, &out};
  Launch(matmul_forward_, "matmul_forward", 1LL * rows * out, args);
}

void LayerKernels::MatmulBackwardInput(Ptr dy, Ptr w, Ptr dx, int rows, int in, int out) const {
  void* args[] = {&dy, &w, &dx, &rows, &in, &out};
  Launch(matmul_backward_input_, "matmul_backward_input", 1LL * rows * in, args);
}

void LayerKernels::MatmulBackwardParams(Ptr x, Ptr dy, Ptr dw, Ptr db, int rows, int in, int out,
                                        int accumulate) const {
  void* args[] = {&x, &dy, &dw, &db, &rows, &in, &out, &accumulate};
  Launch(matmul_backward_params_, "matmul_backward_params", 1LL * in * out + out, args);
}

void LayerKernels::AddVectors(Ptr a, Ptr b, Ptr y, int n) const {
  void* args[] = {&a, &b, &y, &n};
  Launch(add_, "add", n, args);
}

void LayerKernels::ReluForward(Ptr pre, Ptr post, int n) const {
  void* args[] = {&pre, &post, &n};
  Launch(relu_forward_, "relu_forward", n, args);
}

void LayerKernels::ReluBackward(Ptr pre, Ptr grad, int n) const {
  void* args[] = {&pre, &grad, &n};
  Launch(relu_backward_, "relu_backward", n, args);
}

void LayerKernels::Launch(CUfunction function, const char* name, long long threads,
                          void** args) const {
  LaunchPerElement(function, "examples", name, threads, stream_, args);
}

}  // namespace examples
