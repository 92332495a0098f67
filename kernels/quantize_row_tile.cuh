// One 1x128 tile of a row (a token's 128 columns) over 8 lanes, sixteen elements each: lane j
// of the group holds quads j, j + 8, j + 16, j + 24 (kernels/quad_access.cuh: each of the
// group's loads and stores covers adjacent bytes), so a tile's three shuffles, its scale and its
// reciprocal serve sixteen codes (with four a lane they cost as many instructions as the codes:
// ncu found the quantizers issue-bound). The row pass of quantize_fp_tile_1x128 and of
// quantize_fp_tile_1x128_and_transposed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "precision/quantize_fine_grained.h"

namespace gnmr::cuda {

constexpr int kRowTileLanes = 8;
constexpr int kRowTileQuadsPerLane = static_cast<int>(kFineGrainedTile) / 4 / kRowTileLanes;  // 4
constexpr int kRowTileValuesPerLane = 4 * kRowTileQuadsPerLane;                               // 16

// The tile's column of lane j's quad q.
__device__ inline int row_tile_column(int j, int q) {
  return 4 * (j + kRowTileLanes * q);
}

// Lane j's sixteen elements of the tile starting at `in`, `available` elements of the row left
// from there (zeros past them: |0| changes no absmax).
template <bool kQuads>
__device__ inline void load_row_tile(const float* in, int64_t available, int j,
                                     float (&values)[kRowTileValuesPerLane]) {
  for (int q = 0; q < kRowTileQuadsPerLane; ++q) {
    const int c = row_tile_column(j, q);
    float quad[4];
    load_quad<kQuads>(in + c, available - c, quad);
    for (int k = 0; k < 4; ++k) values[4 * q + k] = quad[k];
  }
}

// The tile's scale, which every lane of the group gets. Every lane of the warp calls it (the
// shuffles name the full warp).
template <FpFormat kFormat>
__device__ inline float row_tile_scale(const float (&values)[kRowTileValuesPerLane]) {
  return fine_grained_scale(lane_group_max<kRowTileLanes>(abs_max(values)), kFormat);
}

// Lane j's sixteen codes of the tile, written at `out` as load_row_tile read them.
template <FpFormat kFormat, bool kQuads>
__device__ inline void quantize_row_tile(const float (&values)[kRowTileValuesPerLane], float scale,
                                         uint8_t* out, int64_t available, int j) {
  uint32_t words[kRowTileQuadsPerLane];
  quantize_fp_tile_code_words<kFormat>(values, tile_divisor(scale), words);
  for (int q = 0; q < kRowTileQuadsPerLane; ++q) {
    const int c = row_tile_column(j, q);
    store_quad<kQuads>(out + c, available - c, words[q]);
  }
}

}  // namespace gnmr::cuda
