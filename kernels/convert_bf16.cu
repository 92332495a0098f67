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

// Four elements a thread: one 16-byte load, one 8-byte store (the first element in the low
// half of the first word: little-endian, as the bf16 array is laid out). A warp moves 512
// bytes in and 256 out per instruction, where the kernel above moves 128 and 64: this is the
// projections' commonest operand preparation (every bf16 GEMM's x, dy and W).
__global__ void convert_to_bf16_x4_kernel(const float4* x, int64_t quads, uint2* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    const float4 v = x[i];
    out[i] = make_uint2(uint32_t{encode_bf16(v.x)} | uint32_t{encode_bf16(v.y)} << 16,
                        uint32_t{encode_bf16(v.z)} | uint32_t{encode_bf16(v.w)} << 16);
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
  // The wide kernel where x is 16-byte and out 8-byte aligned (arena tensors are); the last
  // count % 4 elements, and any unaligned call, by the one-element kernel.
  const bool aligned =
      reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t quads = aligned ? count / 4 : 0;
  if (quads > 0) {
    convert_to_bf16_x4_kernel<<<blocks_for(quads), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), quads, reinterpret_cast<uint2*>(out));
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t rest = count - 4 * quads;
  if (rest == 0) return;
  convert_to_bf16_kernel<<<blocks_for(rest), kThreads, 0, stream>>>(x + 4 * quads, rest,
                                                                    out + 4 * quads);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void round_to_bf16(const float* x, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  round_to_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, out, count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
