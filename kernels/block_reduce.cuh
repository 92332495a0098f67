// Reductions within a warp and a thread block (kernel helpers).
// Max of non-negative floats: fmaxf is exact and order-independent, so any reduction tree gives
// the CPU loop's result. Sum of doubles: a fixed butterfly tree, so the same blockDim gives the
// same bits every run (not the CPU's index order); every lane gets the same value, because each
// step adds the same two numbers on both lanes of a pair and IEEE addition commutes.
#pragma once

#include <cuda_runtime.h>

namespace gnmr::cuda {

// The largest magnitude of a thread's values.
template <int kCount>
__device__ inline float abs_max(const float (&values)[kCount]) {
  float absmax = 0.0f;
  for (int e = 0; e < kCount; ++e) absmax = fmaxf(absmax, fabsf(values[e]));
  return absmax;
}

// The max over each aligned group of kLanes lanes (a power of two, at most 32), which all of
// the group's lanes get. Every lane of the warp calls it (the shuffles name the full warp).
template <int kLanes>
__device__ inline float lane_group_max(float value) {
  static_assert(kLanes > 0 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes: 1..32, 2^k");
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  }
  return value;
}

__device__ inline float warp_max(float value) {
  return lane_group_max<32>(value);
}

// Every thread of the block must call it; all get the block's maximum.
// blockDim.x must be a multiple of 32 and at most 1024.
__device__ inline float block_max(float value) {
  __shared__ float warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_max(value);
  __syncthreads();  // warp_results may still be read by a previous call
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? warp_results[lane] : 0.0f;
  return warp_max(value);
}

__device__ inline double warp_sum(double value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  }
  return value;
}

// Every thread of the block must call it; all get the block's sum.
// blockDim.x must be a multiple of 32 and at most 1024.
__device__ inline double block_sum(double value) {
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? warp_sums[lane] : 0.0;
  return warp_sum(value);
}

}  // namespace gnmr::cuda
