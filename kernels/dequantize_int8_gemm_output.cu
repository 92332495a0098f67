// The int8 GEMM's epilogue: cuBLASLt wrote the int32 sums of D (column-major m x n) into the
// fp32 output's memory; each thread reads one sum and writes its fp32 value in its place.
// CPU twin: gnmr::int8_gemm_reference (src/backend/cuda/int8_gemm_reference.h); both call
// int8_gemm_output (src/precision/int8_gemm_output.h).
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/int8_gemm_output.h"

namespace gnmr::cuda {
namespace {

// Not __restrict__: `sums` and `out` are the same memory, each element read, then written, by
// one thread.
__global__ void dequantize_int8_gemm_output_kernel(const int32_t* sums, const float* a_scales,
                                                   const float* b_scales, int64_t m, int64_t n,
                                                   float* out) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int32_t sum = sums[e];
    out[e] = int8_gemm_output(sum, a_scales[e % m], b_scales[e / m]);
  }
}

}  // namespace

void dequantize_int8_gemm_output(void* d, const float* a_scales, const float* b_scales, int64_t m,
                                 int64_t n, cudaStream_t stream) {
  if (m * n == 0) return;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 65536;
  const int64_t blocks = std::min<int64_t>((m * n + kThreads - 1) / kThreads, kMaxBlocks);
  dequantize_int8_gemm_output_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      static_cast<const int32_t*>(d), a_scales, b_scales, m, n, static_cast<float*>(d));
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
