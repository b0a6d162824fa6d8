// The launch shape of the examples' CUDA kernels: a 1-D grid of one thread
// per element (examples::LaunchPerElement launches them so), in which the
// surplus threads of the last block return at once. For .cu files only.
//
// Thread-safety: a pure function of the calling thread's coordinates.
#ifndef STENSOR_EXAMPLES_COMMON_LAUNCH_GRID_H_
#define STENSOR_EXAMPLES_COMMON_LAUNCH_GRID_H_

namespace examples {

// This thread's index in the whole grid.
__device__ inline long long GlobalThreadIndex() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

}  // namespace examples

#endif  // STENSOR_EXAMPLES_COMMON_LAUNCH_GRID_H_
