// The 128x1 tiles of a block of 128 tokens staged in shared memory, quantized and written
// transposed: the column pass of quantize_fp_tile_128x1_transposed and of
// quantize_fp_tile_1x128_and_transposed (the weight gradient's x^T / dy^T operand).
// A column's 128 tokens take 8 lanes, lane j tokens 4j..4j+3 + 32i (i < 4): sixteen codes as
// four words, each written whole (a column's 8 lanes write 32 adjacent bytes of its row of
// codes_t per store), and sixteen elements share the tile's shuffles, scale and reciprocal
// (with four a lane, a warp a column, those cost as many instructions as the codes: ncu found
// the kernels issue-bound). Warp w takes the 4 adjacent columns 4w..4w+3, then those 32 on:
// with a staged row length of 1 mod 32, token 4j + k of column c lies in bank 4j + k + c, so
// every read of the warp hits 32 different banks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {

constexpr int kStagedTokens = static_cast<int>(kFineGrainedTile);
constexpr int kStagedLanesPerColumn = 8;
constexpr int kStagedWordsPerLane = kStagedTokens / 4 / kStagedLanesPerColumn;  // 4

// Whether each lane's four tokens of a column can be one 4-byte store: codes_t's rows of n
// bytes start on 4-byte boundaries.
inline bool staged_column_word_stores(const uint8_t* codes_t, int64_t n) {
  return n % 4 == 0 && reinterpret_cast<uintptr_t>(codes_t) % 4 == 0;
}

// staged: [128 tokens][kRowLength] floats (kRowLength = 1 mod 32), token t of the block's column
// c at staged[t * kRowLength + c], zero past the block's `tokens`. Writes the codes of columns
// c < `columns` to codes_t [cols, n] at row c0 + c, tokens n0.., and their scales to scales_t
// (VEC128 order for a [cols, n] operand, token block n0 / 128). Every thread of the block (a
// multiple of 128 threads) calls it after the block's staging is visible (__syncthreads).
template <FpFormat kFormat, int kRowLength, int kColumns>
__device__ inline void quantize_staged_columns(const float* staged, int tokens, int columns,
                                               int64_t n, int64_t n0, int64_t cols, int64_t c0,
                                               uint8_t* codes_t, float* scales_t,
                                               bool word_stores) {
  static_assert(kRowLength % 32 == 1, "the staged row length is 1 mod 32 (banks)");
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int j = lane % kStagedLanesPerColumn;
  const int columns_at_once = static_cast<int>(blockDim.x) / kStagedLanesPerColumn;
  for (int c0_pass = 0; c0_pass < kColumns; c0_pass += columns_at_once) {
    const int c = c0_pass + 4 * warp + lane / kStagedLanesPerColumn;
    float values[4 * kStagedWordsPerLane];
    for (int i = 0; i < kStagedWordsPerLane; ++i) {
      for (int k = 0; k < 4; ++k) {
        values[4 * i + k] = staged[(4 * j + 32 * i + k) * kRowLength + c];
      }
    }
    const float scale =
        fine_grained_scale(lane_group_max<kStagedLanesPerColumn>(abs_max(values)), kFormat);
    if (c >= columns) continue;  // the group's bound: after the shuffles, which name the warp
    if (j == 0) scales_t[vec128_scale_index(c0 + c, n0 / kStagedTokens, cols)] = scale;
    uint32_t words[kStagedWordsPerLane];
    quantize_fp_tile_code_words<kFormat>(values, tile_divisor(scale), words);
    uint8_t* out = codes_t + (c0 + c) * n + n0;
    for (int i = 0; i < kStagedWordsPerLane; ++i) {
      const int t = 4 * j + 32 * i;
      if (word_stores) {
        store_quad<true>(out + t, tokens - t, words[i]);
      } else {
        store_quad<false>(out + t, tokens - t, words[i]);
      }
    }
  }
}

}  // namespace gnmr::cuda
