// Fine-grained fp quantization of activations in 1x128 tiles (DeepSeek-V3 §3.3.2), any of
// the five formats (fp6 / fp4 stored as e4m3 codes): a block per row and 16 of its tiles, two
// per warp, lane l holding elements 4l..4l+3 of each (kernels/quad_access.cuh: one 16-byte load,
// one 4-byte store); scale = absmax / format max. The scales go in the CPU's order or in
// cuBLASLt's VEC128 order (precision/scale_layout.h), which the block-scaled FP8 GEMM reads.
// A warp walking a whole row's tiles in turn, one tile's loads in flight at a time, measured
// slower on an H200 (ncu) than the earlier warp per tile with a costlier per-element encoder.
// CPU twin: gnmr::quantize_fp_tile_1x128 in src/precision/quantize_fine_grained.h (CPU
// order; vec128_from_row_tiles gives the VEC128 order); both call fine_grained_scale and
// quantize_fp_element (here quantize_fp_tile_elements: the division by the tile's reciprocal
// and the compile-time encoder, the same codes for every float: tests/precision), so codes and
// scales are identical. Partial last tiles included.
#include <algorithm>
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
constexpr int kTilesPerWarp = 2;  // loaded together, then quantized
constexpr int kTilesPerBlock = kWarps * kTilesPerWarp;

// Block (row, g) holds tiles g * 16 .. g * 16 + 15 of the row; warp w tiles w and w + 8 of them.
template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_tile_1x128_kernel(const float* x, int64_t rows, int64_t cols, ScaleOrder order,
                                  uint8_t* codes, float* scales) {
  const int64_t row = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t tiles_per_row = (cols + kTile - 1) / kTile;
  float values[kTilesPerWarp][4];
  int64_t tile[kTilesPerWarp], c[kTilesPerWarp];
  for (int k = 0; k < kTilesPerWarp; ++k) {
    tile[k] = int64_t{blockIdx.y} * kTilesPerBlock + warp + kWarps * k;
    c[k] = tile[k] * kTile + 4 * lane;
    load_quad<kQuads>(x + row * cols + c[k], tile[k] < tiles_per_row ? cols - c[k] : 0, values[k]);
  }
  for (int k = 0; k < kTilesPerWarp; ++k) {
    if (tile[k] >= tiles_per_row) break;  // the whole warp: warp_max sees full warps
    float absmax = 0.0f;
    for (int e = 0; e < 4; ++e) absmax = fmaxf(absmax, fabsf(values[k][e]));
    const float scale = fine_grained_scale(warp_max(absmax), kFormat);
    if (lane == 0) {
      scales[order == ScaleOrder::kCpu ? row * tiles_per_row + tile[k]
                                       : vec128_scale_index(row, tile[k], rows)] = scale;
    }
    uint8_t tile_codes[4];
    quantize_fp_tile_elements<kFormat>(values[k], tile_divisor(scale), tile_codes);
    store_quad<kQuads>(codes + row * cols + c[k], cols - c[k], tile_codes);
  }
}

}  // namespace

void quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                            ScaleOrder order, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  GNMR_CHECK(rows <= INT32_MAX, "quantize_fp_tile_1x128: " + std::to_string(rows) +
                                    " rows is more than the grid holds (2^31 - 1)");
  const dim3 grid(static_cast<unsigned>(rows),
                  grid_y(block_count(block_count(cols, kTile), kTilesPerBlock),
                         "quantize_fp_tile_1x128: a row of " + std::to_string(cols) + " columns"));
  const bool quads = quad_rows(x, cols, codes);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    if (quads) {
      quantize_fp_tile_1x128_kernel<kFormat, true>
          <<<grid, kThreads, 0, stream>>>(x, rows, cols, order, codes, scales);
    } else {
      quantize_fp_tile_1x128_kernel<kFormat, false>
          <<<grid, kThreads, 0, stream>>>(x, rows, cols, order, codes, scales);
    }
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
