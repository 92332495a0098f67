// Both FP8 operands the backward makes of one dy [n, cols] from a single read of it: the input
// gradient's codes [n, cols] in 1x128 tiles along cols (as quantize_fp_tile_1x128 writes them,
// scales in VEC128 order for an [n, cols] operand) and the weight gradient's codes_t [cols, n]
// in 128x1 tiles along n (as quantize_fp_tile_128x1_transposed writes them, scales in VEC128
// order for a [cols, n] operand). Two kernels would read dy twice: 8 of the 10 bytes an element
// costs them, 4 of the 6 here.
// One block per 128 tokens x 128 columns (a 1x128 tile per token, a 128x1 tile per column):
// warp w holds tokens w, w + 8, ..., lane l columns l, l + 32, l + 64, l + 96 of them, so each
// row's reads and codes are one warp's adjacent elements; the column maxima meet in shared
// memory, the column pass reads the block again from L2, and the transposed codes go through
// shared memory so that a warp writes 32 adjacent tokens of a column.
// CPU twins: gnmr::quantize_fp_tile_1x128 and gnmr::quantize_fp_blockwise(x, n, cols, 128, 1,
// ...) (src/precision/quantize_fine_grained.h): the same fine_grained_scale and
// quantize_fp_element (here its compile-time form quantize_fp_element_fast, the same codes for
// every float: tests/precision), so the same codes and scales, bit for bit.
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
constexpr int kTile = static_cast<int>(kFineGrainedTile);
constexpr int kRowsPerWarp = kTile / kWarps;  // 16 tokens
constexpr int kPerLane = kTile / 32;          // 4 columns

template <FpFormat kFormat>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_tile_1x128_and_transposed_kernel(const float* x, int64_t n, int64_t cols,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t) {
  // Each warp's column maxima, then the codes of the 128x1 tiles [token][column]; 132-byte rows
  // (33 words) put the 32 tokens a warp reads of one column in 32 different banks.
  __shared__ float warp_column_max[kWarps][kTile];
  __shared__ uint8_t column_codes[kTile][kTile + 4];
  const int64_t cb = blockIdx.x, tb = blockIdx.y, c0 = cb * kTile, n0 = tb * kTile;
  const int tokens = static_cast<int>(n - n0 < kTile ? n - n0 : kTile);
  const int columns = static_cast<int>(cols - c0 < kTile ? cols - c0 : kTile);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  // Element (token t, column lane + 32 k) of the block, zero past the edges (|0| changes no
  // maximum).
  auto element = [&](int t, int k) {
    const int c = lane + 32 * k;
    return t < tokens && c < columns ? x[(n0 + t) * cols + c0 + c] : 0.0f;
  };

  // Row tiles: read, quantize with the row's scale, write. The token loops stay rolled (two
  // tokens an iteration): unrolled over a warp's 16 tokens, each holding four inlined encoders,
  // the kernel's code outgrew the instruction cache (fp_format_dispatch.cuh).
  float column_max[kPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = warp + kWarps * i;
    float values[kPerLane];
    float row_max = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      values[k] = element(t, k);
      row_max = fmaxf(row_max, fabsf(values[k]));
      column_max[k] = fmaxf(column_max[k], fabsf(values[k]));
    }
    // The bound t < tokens is the same for all lanes: warp_max sees full warps.
    const float scale = fine_grained_scale(warp_max(row_max), kFormat);
    if (t >= tokens) continue;
    if (lane == 0) scales[vec128_scale_index(n0 + t, cb, n)] = scale;
    uint8_t* out = codes + (n0 + t) * cols + c0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int c = lane + 32 * k;
      if (c < columns) out[c] = quantize_fp_element_fast<kFormat>(values[k], scale);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) warp_column_max[warp][lane + 32 * k] = column_max[k];
  __syncthreads();  // every warp's column maxima are in shared memory

  // Column tiles: each thread takes the maxima of its 4 columns over the 8 warps (max is exact,
  // so every thread gets the same scale), then quantizes its elements again, read a second
  // time (from L2: this block read them just now; keeping all 64 in registers is what made
  // the code too long), and parks the codes.
  float column_scale[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + 32 * k;
    float absmax = 0.0f;
    for (int w = 0; w < kWarps; ++w) absmax = fmaxf(absmax, warp_column_max[w][c]);
    column_scale[k] = fine_grained_scale(absmax, kFormat);
    if (warp == 0 && c < columns) scales_t[vec128_scale_index(c0 + c, tb, cols)] = column_scale[k];
  }
#pragma unroll 2
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = warp + kWarps * i;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      column_codes[t][lane + 32 * k] =
          quantize_fp_element_fast<kFormat>(element(t, k), column_scale[k]);
    }
  }
  __syncthreads();  // the block's column codes are in shared memory
  for (int c = warp; c < columns; c += kWarps) {
    uint8_t* out = codes_t + (c0 + c) * n + n0;
    for (int k = 0; k < kPerLane; ++k) {
      const int t = lane + 32 * k;
      if (t < tokens) out[t] = column_codes[t][c];
    }
  }
}

}  // namespace

void quantize_fp_tile_1x128_and_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                           uint8_t* codes, float* scales, uint8_t* codes_t,
                                           float* scales_t, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(block_count(cols, kTile)),
                  grid_y(block_count(n, kTile), "quantize_fp_tile_1x128_and_transposed: " +
                                                    std::to_string(n) + " tokens"));
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    quantize_fp_tile_1x128_and_transposed_kernel<kFormat>
        <<<grid, kThreads, 0, stream>>>(x, n, cols, codes, scales, codes_t, scales_t);
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
