// Both FP8 operands the backward makes of one dy [n, cols] from a single read of it: the input
// gradient's codes [n, cols] in 1x128 tiles along cols (as quantize_fp_tile_1x128 writes them,
// scales in VEC128 order for an [n, cols] operand) and the weight gradient's codes_t [cols, n]
// in 128x1 tiles along n (as quantize_fp_tile_128x1_transposed writes them, scales in VEC128
// order for a [cols, n] operand). Two kernels would read dy twice: 8 of the 10 bytes an element
// costs them, 4 of the 6 here.
// One block per 128 tokens x 128 columns (a 1x128 tile per token, a 128x1 tile per column):
// warp w holds tokens w, w + 8, ..., lane l columns 4l..4l+3 of them (a quad,
// kernels/quad_access.cuh: one 16-byte load, one 4-byte store of codes), so each row's reads
// and codes are one warp's adjacent bytes; the column maxima meet in shared memory, the column
// pass reads the block again from L2, and the transposed codes go through shared memory so
// that a warp writes 32 adjacent tokens of a column.
// CPU twins: gnmr::quantize_fp_tile_1x128 and gnmr::quantize_fp_blockwise(x, n, cols, 128, 1,
// ...) (src/precision/quantize_fine_grained.h): the same fine_grained_scale and
// quantize_fp_element (here quantize_fp_tile_elements and its parts: the division by the
// tile's reciprocal and the compile-time encoder, the same codes for every float:
// tests/precision), so the same codes and scales, bit for bit.
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
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
  const int c = 4 * lane;  // this lane's first column of the block
  // Token t's quad of this lane, zero past the edges (|0| changes no maximum).
  auto load = [&](int t, float(&values)[4]) {
    load_quad<kQuads>(x + (n0 + t) * cols + c0 + c, t < tokens ? columns - c : 0, values);
  };

  // Row tiles: read, quantize with the row's scale, write. The token loops stay rolled (two
  // tokens an iteration): unrolled over a warp's 16 tokens the kernel's code outgrew the
  // instruction cache (precision/fp_format_dispatch.h).
  float column_max[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = warp + kWarps * i;
    float values[4];
    load(t, values);
    float row_max = 0.0f;
    for (int k = 0; k < 4; ++k) {
      row_max = fmaxf(row_max, fabsf(values[k]));
      column_max[k] = fmaxf(column_max[k], fabsf(values[k]));
    }
    // The bound t < tokens is the same for all lanes: warp_max sees full warps.
    const float scale = fine_grained_scale(warp_max(row_max), kFormat);
    if (t >= tokens) continue;
    if (lane == 0) scales[vec128_scale_index(n0 + t, cb, n)] = scale;
    uint8_t row_codes[4];
    quantize_fp_tile_elements<kFormat>(values, tile_divisor(scale), row_codes);
    store_quad<kQuads>(codes + (n0 + t) * cols + c0 + c, columns - c, row_codes);
  }
  for (int k = 0; k < 4; ++k) warp_column_max[warp][c + k] = column_max[k];
  __syncthreads();  // every warp's column maxima are in shared memory

  // Column tiles: each thread takes the maxima of its 4 columns over the 8 warps (max is exact,
  // so every thread gets the same scale), then quantizes its elements again, read a second
  // time (from L2: this block read them just now), and parks the codes. A column without a
  // reciprocal (a scale under 2^-80, TileDivisor) sends the thread's loop through the division.
  TileDivisor divisors[4];
  bool by_reciprocal = true;
  for (int k = 0; k < 4; ++k) {
    float absmax = 0.0f;
    for (int w = 0; w < kWarps; ++w) absmax = fmaxf(absmax, warp_column_max[w][c + k]);
    divisors[k] = tile_divisor(fine_grained_scale(absmax, kFormat));
    by_reciprocal = by_reciprocal && divisors[k].reciprocal != 0.0f;
    if (warp == 0 && c + k < columns) {
      scales_t[vec128_scale_index(c0 + c + k, tb, cols)] = divisors[k].scale;
    }
  }
  const uint8_t nan_code = fp_nan_code<kFormat>();
#pragma unroll 2
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = warp + kWarps * i;
    float values[4];
    load(t, values);
    uint8_t quad_codes[4];
    for (int k = 0; k < 4; ++k) {
      quad_codes[k] =
          by_reciprocal
              ? quantize_fp_element_by_reciprocal<kFormat>(values[k], divisors[k], nan_code)
              : quantize_fp_element_fast<kFormat>(values[k], divisors[k].scale);
    }
    store_quad<true>(&column_codes[t][c], 4, quad_codes);  // 4-byte aligned: 132-byte rows
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
