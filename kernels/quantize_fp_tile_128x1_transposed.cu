// The weight-gradient GEMM's FP8 operands: x [n, cols] (or dy) quantized in 128x1 tiles along
// the token dimension n, written transposed as codes_t [cols, n] (the TN operand x^T / dy^T),
// scales in cuBLASLt's VEC128 order for a [cols, n] operand (scale of column c, token block b at
// c + b * cols, precision/scale_layout.h).
// One block per 128 tokens x 64 columns, through shared memory, so both sides coalesce: a warp
// reads 32 adjacent columns of one token (128 bytes), and writes 32 adjacent tokens of one
// column of codes_t (one 32-byte sector per store), where a thread per column would write a
// byte to each of 32 rows n bytes apart per store.
// CPU twin: gnmr::quantize_fp_blockwise(x, n, cols, 128, 1, ...) in
// src/precision/quantize_fine_grained.h, whose scale grid [ceil(n / 128), cols] is this order,
// and whose codes this kernel writes transposed (by quantize_fp_element_fast, the compile-time
// form of its quantize_fp_element: the same codes for every float, tests/precision).
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_format_dispatch.cuh"
#include "kernels/quantize.cuh"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTokens = static_cast<int>(kFineGrainedTile);  // one scale tile along n
constexpr int kColumns = 64;
constexpr int kPerLane = kTokens / 32;  // a lane's tokens of one column

template <FpFormat kFormat>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_tile_128x1_transposed_kernel(const float* x, int64_t n, int64_t cols,
                                             uint8_t* codes_t, float* scales) {
  // x[n0 + t, c0 + c] at tile[t][c], zero past the edges (|0| changes no absmax). The odd row
  // length puts the 32 tokens a warp reads of one column in 32 different banks.
  __shared__ float tile[kTokens][kColumns + 1];
  const int64_t c0 = blockIdx.x * int64_t{kColumns}, b = blockIdx.y, n0 = b * kTokens;
  const int tokens = static_cast<int>(n - n0 < kTokens ? n - n0 : kTokens);
  const int columns = static_cast<int>(cols - c0 < kColumns ? cols - c0 : kColumns);
  for (int e = static_cast<int>(threadIdx.x); e < kTokens * kColumns; e += kThreads) {
    const int t = e / kColumns, c = e % kColumns;
    tile[t][c] = t < tokens && c < columns ? x[(n0 + t) * cols + c0 + c] : 0.0f;
  }
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  // A warp per column (the bound is the same for all its lanes, so warp_max sees full warps);
  // lane l holds tokens l, l + 32, l + 64, l + 96.
  for (int c = warp; c < columns; c += kWarps) {
    float values[kPerLane];
    float absmax = 0.0f;
    for (int k = 0; k < kPerLane; ++k) {
      values[k] = tile[lane + 32 * k][c];
      absmax = fmaxf(absmax, fabsf(values[k]));
    }
    const float scale = fine_grained_scale(warp_max(absmax), kFormat);
    if (lane == 0) scales[vec128_scale_index(c0 + c, b, cols)] = scale;
    uint8_t* out = codes_t + (c0 + c) * n + n0;
    for (int k = 0; k < kPerLane; ++k) {
      const int t = lane + 32 * k;
      if (t < tokens) out[t] = quantize_fp_element_fast<kFormat>(values[k], scale);
    }
  }
}

}  // namespace

void quantize_fp_tile_128x1_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                       uint8_t* codes_t, float* scales, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(block_count(cols, kColumns)),
                  grid_y(block_count(n, kTokens),
                         "quantize_fp_tile_128x1_transposed: " + std::to_string(n) + " tokens"));
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    quantize_fp_tile_128x1_transposed_kernel<kFormat>
        <<<grid, kThreads, 0, stream>>>(x, n, cols, codes_t, scales);
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
