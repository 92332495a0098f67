// Fine-grained fp quantization of activations in 1x128 tiles (DeepSeek-V3 §3.3.2), any of
// the five formats (fp6 / fp4 stored as e4m3 codes): a warp per row, walking its tiles, lane l
// holding elements 4l..4l+3 of each (kernels/quad_access.cuh: one 16-byte load, one 4-byte
// store); scale = absmax / format max. The scales go in the CPU's order or in cuBLASLt's
// VEC128 order (precision/scale_layout.h), which the block-scaled FP8 GEMM reads.
// In the 1B bench on an H200 this form took 6.1 ms of "prep x" per step, two tiles a warp on a
// 2-D grid 7.6 ms (though ncu's isolated replays ranked the second faster, 54 against 57 us for
// 8192 x 2048).
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

constexpr int kThreads = 256;  // 8 rows per block
constexpr int kWarps = kThreads / 32;
constexpr int kTile = static_cast<int>(kFineGrainedTile);

template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_tile_1x128_kernel(const float* x, int64_t rows, int64_t cols, ScaleOrder order,
                                  uint8_t* codes, float* scales) {
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp: warp_max below sees full warps
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t tiles_per_row = (cols + kTile - 1) / kTile;
  const float* in = x + row * cols;
  uint8_t* out = codes + row * cols;
#pragma unroll 2
  for (int64_t tile = 0; tile < tiles_per_row; ++tile) {
    const int64_t c = tile * kTile + 4 * lane;
    float values[4];
    load_quad<kQuads>(in + c, cols - c, values);
    float absmax = 0.0f;
    for (int k = 0; k < 4; ++k) absmax = fmaxf(absmax, fabsf(values[k]));
    const float scale = fine_grained_scale(warp_max(absmax), kFormat);
    if (lane == 0) {
      scales[order == ScaleOrder::kCpu ? row * tiles_per_row + tile
                                       : vec128_scale_index(row, tile, rows)] = scale;
    }
    uint8_t tile_codes[4];
    quantize_fp_tile_elements<kFormat>(values, tile_divisor(scale), tile_codes);
    store_quad<kQuads>(out + c, cols - c, tile_codes);
  }
}

}  // namespace

void quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                            ScaleOrder order, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t blocks = block_count(rows, kWarps);
  GNMR_CHECK(blocks <= INT32_MAX, "quantize_fp_tile_1x128: " + std::to_string(rows) +
                                      " rows is more than the grid holds");
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
