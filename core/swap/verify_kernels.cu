// The hash kernel of STENSOR_VERIFY=hash, built by nvcc into a fatbin that
// libstensor.so embeds (sm_80 and sm_90 cubins plus compute_90 PTX). Its
// host twin, with the same signature and so the same name, is
// verify_kernels_host.cc.
//
// hash_sum adds the terms of the `size` bytes at `data` (8-byte aligned) to
// *sum: a grid-stride loop over the words, a warp then block reduction, one
// atomicAdd per block. The sum is independent of the grid (see
// verify_hash.h); the caller zeroes *sum first and applies Finish.
#include "core/swap/verify_hash.h"

namespace stensor_verify {

__global__ void hash_sum(const unsigned char* data, unsigned long long size,
                         unsigned long long* sum) {
  const u64 words = Words(size);
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  u64 acc = 0;
  for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride) {
    acc += Term(Word(data, size, i), i);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  __shared__ u64 warp_sums[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0;
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0) atomicAdd(sum, acc);
}

}  // namespace stensor_verify
