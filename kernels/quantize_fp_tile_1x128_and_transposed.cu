// Both FP8 operands the backward makes of one dy [n, cols] from a single read of it: the input
// gradient's codes [n, cols] in 1x128 tiles along cols (as quantize_fp_tile_1x128 writes them,
// scales in VEC128 order for an [n, cols] operand) and the weight gradient's codes_t [cols, n]
// in 128x1 tiles along n (as quantize_fp_tile_128x1_transposed writes them, scales in VEC128
// order for a [cols, n] operand). Two kernels would read dy twice: 8 of the 10 bytes an element
// costs them, 4 of the 6 here.
// One block per 128 tokens x 128 columns (a 1x128 tile per token, a 128x1 tile per column).
// The row pass gives a token's tile 8 lanes, sixteen elements each (four quads,
// kernels/quad_access.cuh: 16-byte loads, 4-byte stores of codes; each group's accesses
// cover adjacent bytes), and keeps each thread's column maxima; they meet in shared memory.
// The column pass reads the block again from L2, lane l columns 4l..4l+3 of tokens w, w + 8,
// ... (warp w), and the transposed codes go through shared memory so that a warp writes 32
// adjacent tokens of a column.
// CPU twins: gnmr::quantize_fp_tile_1x128 and gnmr::quantize_fp_blockwise(x, n, cols, 128, 1,
// ...) (src/precision/quantize_fine_grained.h): the same fine_grained_scale and
// quantize_fp_element's codes (here quantize_fp_tile_code_words and quantize_fp_quad_of_tiles,
// kernels/fp_storage_conversion.cuh: the division by the tile's reciprocal, the conversion
// instructions or the compile-time encoder, the same codes for every float: tests/precision,
// tests/gpu), so the same codes and scales, bit for bit.
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/quantize.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = static_cast<int>(kFineGrainedTile);
constexpr int kRowsPerWarp = kTile / kWarps;  // 16 tokens

template <FpFormat kFormat, bool kQuads>
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

  // Row tiles: read, quantize with the row's scale, write. A token's 128 columns take 8 lanes
  // (lane j of its group holds quads j, j + 8, j + 16, j + 24: sixteen elements share the
  // tile's shuffles, scale and reciprocal, which with four a lane cost as many instructions as
  // the codes: ncu found the kernel issue-bound), a warp four tokens at a time. The loop over a
  // thread's four tokens stays rolled two at a time (the instruction cache,
  // precision/fp_format_dispatch.h). Each thread also keeps the maxima of its sixteen columns.
  constexpr int kLanesPerRow = 8;
  constexpr int kQuadsPerLane = kTile / 4 / kLanesPerRow;  // 4
  constexpr int kTokensAtOnce = kThreads / kLanesPerRow;   // 32 (a warp 4)
  const int j = lane % kLanesPerRow;
  float column_max[4 * kQuadsPerLane] = {};
#pragma unroll 2
  for (int i = 0; i < kTile / kTokensAtOnce; ++i) {
    const int t = kTokensAtOnce * i + static_cast<int>(threadIdx.x) / kLanesPerRow;
    const int64_t available = t < tokens ? columns : 0;  // the bound is the group's
    const float* in = x + (n0 + t) * cols + c0;
    float values[4 * kQuadsPerLane];
    for (int q = 0; q < kQuadsPerLane; ++q) {
      const int c = 4 * (j + kLanesPerRow * q);
      float quad[4];
      load_quad<kQuads>(in + c, available - c, quad);  // zeros past the edges: |0| is no max
      for (int k = 0; k < 4; ++k) values[4 * q + k] = quad[k];
    }
    float row_max = 0.0f;
    for (int e = 0; e < 4 * kQuadsPerLane; ++e) {
      row_max = fmaxf(row_max, fabsf(values[e]));
      column_max[e] = fmaxf(column_max[e], fabsf(values[e]));
    }
    const float scale = fine_grained_scale(lane_group_max<kLanesPerRow>(row_max), kFormat);
    if (t >= tokens) continue;
    if (j == 0) scales[vec128_scale_index(n0 + t, cb, n)] = scale;
    uint32_t words[kQuadsPerLane];
    quantize_fp_tile_code_words<kFormat>(values, tile_divisor(scale), words);
    uint8_t* out = codes + (n0 + t) * cols + c0;
    for (int q = 0; q < kQuadsPerLane; ++q) {
      const int c = 4 * (j + kLanesPerRow * q);
      store_quad<kQuads>(out + c, available - c, words[q]);
    }
  }
  // The warp's column maxima: the four groups of a warp hold the same columns (xor 8 and 16
  // pair lane j of each), then group 0 parks them.
  for (int e = 0; e < 4 * kQuadsPerLane; ++e) {
    column_max[e] = fmaxf(column_max[e], __shfl_xor_sync(0xFFFFFFFFu, column_max[e], 8));
    column_max[e] = fmaxf(column_max[e], __shfl_xor_sync(0xFFFFFFFFu, column_max[e], 16));
  }
  if (lane < kLanesPerRow) {
    for (int q = 0; q < kQuadsPerLane; ++q) {
      for (int k = 0; k < 4; ++k) {
        warp_column_max[warp][4 * (j + kLanesPerRow * q) + k] = column_max[4 * q + k];
      }
    }
  }
  __syncthreads();  // every warp's column maxima are in shared memory

  // The column pass: lane l holds columns 4l..4l+3 of tokens warp, warp + 8, ...
  const int c = 4 * lane;  // this lane's first column of the block
  // Token t's quad of this lane, zero past the edges.
  auto load = [&](int t, float(&values)[4]) {
    load_quad<kQuads>(x + (n0 + t) * cols + c0 + c, t < tokens ? columns - c : 0, values);
  };
  // Column tiles: each thread takes the maxima of its 4 columns over the 8 warps (max is exact,
  // so every thread gets the same scale), then quantizes its elements again, read a second
  // time (from L2: this block read them just now), and parks the codes. A column without a
  // reciprocal (a scale under 2^-80, TileDivisor) sends the thread's quads through the division.
  TileDivisor divisors[4];
  for (int k = 0; k < 4; ++k) {
    float absmax = 0.0f;
    for (int w = 0; w < kWarps; ++w) absmax = fmaxf(absmax, warp_column_max[w][c + k]);
    divisors[k] = tile_divisor(fine_grained_scale(absmax, kFormat));
    if (warp == 0 && c + k < columns) {
      scales_t[vec128_scale_index(c0 + c + k, tb, cols)] = divisors[k].scale;
    }
  }
#pragma unroll 2
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = warp + kWarps * i;
    float values[4];
    load(t, values);
    store_quad<true>(
        &column_codes[t][c], 4,
        quantize_fp_quad_of_tiles<kFormat>(values, divisors));  // 4-byte aligned: 132-byte rows
  }
  __syncthreads();  // the block's column codes are in shared memory
  for (int col = warp; col < columns; col += kWarps) {
    uint8_t* out = codes_t + (c0 + col) * n + n0;
    for (int k = 0; k < 4; ++k) {
      const int t = lane + 32 * k;
      if (t < tokens) out[t] = column_codes[t][col];
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
  const bool quads = quad_rows(x, cols, codes);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads>
          <<<grid, kThreads, 0, stream>>>(x, n, cols, codes, scales, codes_t, scales_t);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
