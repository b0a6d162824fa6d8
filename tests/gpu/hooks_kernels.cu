// The kernels tests/hooks_all.cc launches, for a GPU: the same names and
// results as tests/fakecuda/test_kernels.cc's host kernels. Built into a
// fatbin by scripts/gpu_bundle.sh so that gpu_check.sh can run hooks_all on
// the real driver.
namespace testk {

// y[i] += a * x[i], rounded as the host model rounds it (no fused
// multiply-add).
__global__ void axpy(float a, const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
  }
}

}  // namespace testk
