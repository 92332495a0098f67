// The weight-gradient GEMM's FP8 operands: x [n, cols] (or dy) quantized in 128x1 tiles along
// the token dimension n, written transposed as codes_t [cols, n] (the TN operand x^T / dy^T),
// scales in cuBLASLt's VEC128 order for a [cols, n] operand (scale of column c, token block b at
// c + b * cols, precision/scale_layout.h). One thread per (column, token block): adjacent
// threads read adjacent columns, so the reads coalesce; the transposed writes do not (simple
// first; a shared-memory transpose is the fast version).
// CPU twin: gnmr::quantize_fp_blockwise(x, n, cols, 128, 1, ...) in
// src/precision/quantize_fine_grained.h, whose scale grid [ceil(n / 128), cols] is this order,
// and whose codes this kernel writes transposed.
#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTile = kFineGrainedTile;

__global__ void quantize_fp_tile_128x1_transposed_kernel(const float* x, int64_t n, int64_t cols,
                                                         FpFormat format, uint8_t* codes_t,
                                                         float* scales) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t b = blockIdx.y;
  if (c >= cols) return;
  const int64_t n0 = b * kTile, n1 = n < n0 + kTile ? n : n0 + kTile;
  float absmax = 0.0f;
  for (int64_t t = n0; t < n1; ++t) absmax = fmaxf(absmax, fabsf(x[t * cols + c]));
  const float scale = fine_grained_scale(absmax, format);
  scales[vec128_scale_index(c, b, cols)] = scale;
  for (int64_t t = n0; t < n1; ++t)
    codes_t[c * n + t] = quantize_fp_element(x[t * cols + c], scale, format);
}

}  // namespace

void quantize_fp_tile_128x1_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                       uint8_t* codes_t, float* scales, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(block_count(cols, kThreads)),
                  static_cast<unsigned>(block_count(n, kTile)));
  quantize_fp_tile_128x1_transposed_kernel<<<grid, kThreads, 0, stream>>>(x, n, cols, format,
                                                                          codes_t, scales);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
