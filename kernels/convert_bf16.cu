// float -> bf16 (round to nearest, ties to even), the BF16 GEMM's operands.
// CPU twin: gnmr::encode_bf16 (src/precision/bf16.h), which this kernel calls per element.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/bf16.h"

namespace gnmr::cuda {
namespace {

__global__ void convert_to_bf16_kernel(const float* x, int64_t count, uint16_t* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] = encode_bf16(x[i]);
  }
}

}  // namespace

void convert_to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  const int blocks =
      static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 1 << 16));
  convert_to_bf16_kernel<<<blocks, kThreads, 0, stream>>>(x, count, out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
