// Fine-grained fp quantization of activations in 1x128 tiles (DeepSeek-V3 §3.3.2), any of
// the five formats (fp6 / fp4 stored as e4m3 codes): 8 lanes per tile, sixteen elements each
// (kernels/quantize_row_tile.cuh), a warp four tiles; scale = absmax / format max. With four
// elements a lane (a warp a tile) the kernel was issue-bound (ncu on an H200: 61% of issue
// slots used, 37% of DRAM bandwidth).
// The scales go in the CPU's order or in cuBLASLt's VEC128 order (precision/scale_layout.h),
// which the block-scaled FP8 GEMM reads.
// On an H200 (ncu, e3m2, 8192 x 2048): 22 us at 70% of the DRAM bandwidth, where a warp a row
// (a quad a lane) took 54 us; "prep x" in the 1B bench 6.1 -> 3.5 ms a step (with the conversion
// instructions). Two tiles a warp on a 2-D grid had measured slower in the bench (7.6 ms)
// though faster in ncu's isolated replays.
// CPU twin: gnmr::quantize_fp_tile_1x128 in src/precision/quantize_fine_grained.h (CPU
// order; vec128_from_row_tiles gives the VEC128 order); both call fine_grained_scale, and the
// codes are quantize_fp_element's (here quantize_fp_tile_code_words: the division by the tile's
// reciprocal, the conversion instructions or the compile-time encoder, the same codes for
// every float: tests/precision, tests/gpu), so codes and scales are identical. Partial last
// tiles included.
#include <algorithm>
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/quantize.cuh"
#include "kernels/quantize_row_tile.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = static_cast<int>(kFineGrainedTile);
constexpr int kTilesPerBlock = kThreads / kRowTileLanes;  // 32 (a warp four)

template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_tile_1x128_kernel(const float* x, int64_t rows, int64_t cols, ScaleOrder order,
                                  uint8_t* codes, float* scales) {
  const int64_t tiles_per_row = (cols + kTile - 1) / kTile;
  const int64_t tile = blockIdx.x * int64_t{kTilesPerBlock} + threadIdx.x / kRowTileLanes;
  // A group past the last tile reads zeros and writes nothing, but stays for the shuffles
  // (they name the whole warp). Its lanes agree on `valid`.
  const bool valid = tile < rows * tiles_per_row;
  // The row and tile of `tile`: in 32 bits where they fit (a 64-bit division is a call of some
  // seventy instructions, as many as a lane's sixteen codes).
  int64_t row = 0, c0 = 0;
  if (valid) {
    if (rows * tiles_per_row <= INT32_MAX) {
      const uint32_t t32 = static_cast<uint32_t>(tile),
                     per_row = static_cast<uint32_t>(tiles_per_row);
      row = t32 / per_row;
      c0 = int64_t{t32 % per_row} * kTile;
    } else {
      row = tile / tiles_per_row;
      c0 = tile % tiles_per_row * kTile;
    }
  }
  const int64_t available = valid ? cols - c0 : 0;  // the row's elements from c0 on
  const int j = static_cast<int>(threadIdx.x) % kRowTileLanes;
  float values[kRowTileValuesPerLane];
  load_row_tile<kQuads>(x + row * cols + c0, available, j, values);
  const float scale = row_tile_scale<kFormat>(values);
  if (!valid) return;
  if (j == 0) {
    const int64_t t = c0 / kTile;
    scales[order == ScaleOrder::kCpu ? row * tiles_per_row + t : vec128_scale_index(row, t, rows)] =
        scale;
  }
  quantize_row_tile<kFormat, kQuads>(values, scale, codes + row * cols + c0, available, j);
}

}  // namespace

void quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                            ScaleOrder order, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t blocks = block_count(rows * block_count(cols, kTile), kTilesPerBlock);
  GNMR_CHECK(blocks <= INT32_MAX, "quantize_fp_tile_1x128: " + std::to_string(rows) + " x " +
                                      std::to_string(cols) + " is more than the grid holds");
  const bool quads = quad_rows(x, cols, codes);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      quantize_fp_tile_1x128_kernel<kFormat, kQuads>
          <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, rows, cols, order, codes,
                                                                   scales);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
