// Both FP8 operands the backward makes of one dy [n, cols] from a single read of it: the input
// gradient's codes [n, cols] in 1x128 tiles along cols (as quantize_fp_tile_1x128 writes them,
// scales in VEC128 order for an [n, cols] operand) and the weight gradient's codes_t [cols, n]
// in 128x1 tiles along n (as quantize_fp_tile_128x1_transposed writes them, scales in VEC128
// order for a [cols, n] operand). Two kernels would read dy twice: 8 of the 10 bytes an element
// costs them, 4 of the 6 here.
// One block per 128 tokens x 128 columns (a 1x128 tile per token, a 128x1 tile per column).
// The row pass gives a token's tile 8 lanes, sixteen elements each
// (kernels/quantize_row_tile.cuh), and stages the block in shared memory (66 KB); the column pass
// (kernels/quantize_staged_columns.cuh) quantizes the staged columns and writes each one's
// row of codes_t 32 adjacent bytes a store. Before the staging, the column pass read the
// block again from L2 and the transposed codes went through shared memory a byte at a time.
// On an H200 (ncu, e3m2, 8192 x 2048): 36 us, 79 us with a warp per tile row and the integer
// encoder; "prep dy (dW+dx)" in the 1B bench 19.8 -> 9.3 ms a step.
// CPU twins: gnmr::quantize_fp_tile_1x128 and gnmr::quantize_fp_blockwise(x, n, cols, 128, 1,
// ...) (src/precision/quantize_fine_grained.h): the same fine_grained_scale and
// quantize_fp_element's codes (here quantize_fp_tile_code_words, kernels/fp_storage_conversion.cuh:
// the division by the tile's reciprocal, the conversion instructions or the compile-time
// encoder, the same codes for every float: tests/precision, tests/gpu), so the same codes and
// scales, bit for bit.
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/quantize.cuh"
#include "kernels/quantize_row_tile.cuh"
#include "kernels/quantize_staged_columns.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

// 16 warps a block, two blocks a multiprocessor (their 132 KB of staging; at most 64
// registers a thread): with 8 warps the 66 KB left three blocks, 24 warps, and ncu found no
// warp ready to issue in a third of the cycles.
constexpr int kThreads = 512;
constexpr int kTile = static_cast<int>(kFineGrainedTile);
constexpr int kRowLength = kTile + 1;  // floats a staged token: 1 mod 32 (banks)
constexpr size_t kStagedBytes = size_t{kTile} * kRowLength * sizeof(float);  // 66,048

template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads, 2)
    quantize_fp_tile_1x128_and_transposed_kernel(const float* x, int64_t n, int64_t cols,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, bool word_stores) {
  // The block's elements, [token][kRowLength], zero past the edges (|0| changes no maximum).
  extern __shared__ float staged[];
  const int64_t cb = blockIdx.x, tb = blockIdx.y, c0 = cb * kTile, n0 = tb * kTile;
  const int tokens = static_cast<int>(n - n0 < kTile ? n - n0 : kTile);
  const int columns = static_cast<int>(cols - c0 < kTile ? cols - c0 : kTile);

  // Row tiles (kernels/quantize_row_tile.cuh: 8 lanes a token, a warp four tokens at a time):
  // read, stage for the column pass, quantize with the row's scale, write. Token t's element c
  // is staged in bank t + c (mod 32): the warp's stores hit 32 different banks. A thread's two
  // tokens are one iteration each (the instruction cache, precision/fp_format_dispatch.h).
  constexpr int kTokensAtOnce = kThreads / kRowTileLanes;  // 64 (a warp 4)
  const int j = static_cast<int>(threadIdx.x) % kRowTileLanes;
#pragma unroll 1
  for (int i = 0; i < kTile / kTokensAtOnce; ++i) {
    const int t = kTokensAtOnce * i + static_cast<int>(threadIdx.x) / kRowTileLanes;
    const int64_t available = t < tokens ? columns : 0;  // the bound is the group's
    float values[kRowTileValuesPerLane];
    load_row_tile<kQuads>(x + (n0 + t) * cols + c0, available, j, values);
    for (int q = 0; q < kRowTileQuadsPerLane; ++q) {
      for (int k = 0; k < 4; ++k)
        staged[t * kRowLength + row_tile_column(j, q) + k] = values[4 * q + k];
    }
    const float scale = row_tile_scale<kFormat>(values);
    if (t >= tokens) continue;
    if (j == 0) scales[vec128_scale_index(n0 + t, cb, n)] = scale;
    quantize_row_tile<kFormat, kQuads>(values, scale, codes + (n0 + t) * cols + c0, available, j);
  }
  __syncthreads();  // the block is staged

  // Column tiles: from shared memory, written transposed (kernels/quantize_staged_columns.cuh).
  quantize_staged_columns<kFormat, kRowLength, kTile>(staged, tokens, columns, n, n0, cols, c0,
                                                      codes_t, scales_t, word_stores);
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
  const bool word_stores = staged_column_word_stores(codes_t, n);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      // Over the 48 KiB a block gets without asking (every GPU with FP8 GEMMs allows it).
      GNMR_CUDA_CHECK(cudaFuncSetAttribute(
          quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads>,
          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedBytes)));
      quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads>
          <<<grid, kThreads, kStagedBytes, stream>>>(x, n, cols, codes, scales, codes_t, scales_t,
                                                     word_stores);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
