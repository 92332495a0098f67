// float -> bf16 (round to nearest, ties to even), the BF16 GEMM's operands, and the same
// rounding kept as f32 (emulated bf16 storage).
// CPU twins: gnmr::encode_bf16 (src/precision/bf16.h), which convert_to_bf16 calls per element,
// and gnmr::cpu::round_to_bf16_copy (src/backend/cpu/matmul.cpp), which calls round_to_bf16
// from the same header as round_to_bf16 here: bit-identical.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "kernels/train_ops.cuh"
#include "precision/bf16.h"

namespace gnmr::cuda {
namespace {

__global__ void convert_to_bf16_kernel(const float* x, int64_t count, uint16_t* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] = encode_bf16(x[i]);
  }
}

// out may be x: each thread reads its element, then writes it.
__global__ void round_to_bf16_kernel(const float* x, float* out, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] = gnmr::round_to_bf16(x[i]);
  }
}

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 1 << 16));
}

}  // namespace

void convert_to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream) {
  if (count == 0) return;
  convert_to_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, count, out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void round_to_bf16(const float* x, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  round_to_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, out, count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
