// Fine-grained fp quantization of activations in 1x128 tiles (DeepSeek-V3 §3.3.2), any of
// the five formats (fp6 / fp4 stored as e4m3 codes): one warp per tile, each lane holding 4 of
// its elements; scale = absmax / format max. The scales go in the CPU's order or in cuBLASLt's
// VEC128 order (precision/scale_layout.h), which the block-scaled FP8 GEMM reads.
// CPU twin: gnmr::quantize_fp_tile_1x128 in src/precision/quantize_fine_grained.h (CPU
// order; vec128_from_row_tiles gives the VEC128 order); both call fine_grained_scale and
// quantize_fp_element (here its compile-time form quantize_fp_element_fast, the same codes for
// every float: tests/precision), so codes and scales are identical. Partial last tiles included.
#include <algorithm>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_format_dispatch.cuh"
#include "kernels/quantize.cuh"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;  // 8 tiles per block
constexpr int kTile = static_cast<int>(kFineGrainedTile);

template <FpFormat kFormat>
__global__ void quantize_fp_tile_1x128_kernel(const float* x, int64_t rows, int64_t cols,
                                              ScaleOrder order, uint8_t* codes, float* scales) {
  const int64_t tiles_per_row = (cols + kTile - 1) / kTile;
  const int64_t tiles = rows * tiles_per_row;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  // The loop bound is the same for all lanes of a warp, so the shuffles see full warps.
  for (int64_t tile = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; tile < tiles;
       tile += warps) {
    const int64_t row = tile / tiles_per_row;
    const int64_t col0 = (tile % tiles_per_row) * kTile;
    const int64_t width = cols - col0 < kTile ? cols - col0 : kTile;
    const float* in = x + row * cols + col0;
    float values[kTile / 32];
    float absmax = 0.0f;
    for (int k = 0; k < kTile / 32; ++k) {
      const int c = lane + 32 * k;
      values[k] = c < width ? in[c] : 0.0f;
      absmax = fmaxf(absmax, fabsf(values[k]));
    }
    const float scale = fine_grained_scale(warp_max(absmax), kFormat);
    if (lane == 0) {
      const int64_t at =
          order == ScaleOrder::kCpu ? tile : vec128_scale_index(row, tile % tiles_per_row, rows);
      scales[at] = scale;
    }
    uint8_t* out = codes + row * cols + col0;
    for (int k = 0; k < kTile / 32; ++k) {
      const int c = lane + 32 * k;
      if (c < width) out[c] = quantize_fp_element_fast<kFormat>(values[k], scale);
    }
  }
}

}  // namespace

void quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                            ScaleOrder order, uint8_t* codes, float* scales, cudaStream_t stream) {
  const int64_t tiles = rows * ((cols + kTile - 1) / kTile);
  if (tiles == 0) return;
  const int64_t tiles_per_block = kThreads / 32;
  const int blocks =
      static_cast<int>(std::min<int64_t>((tiles + tiles_per_block - 1) / tiles_per_block, 1 << 20));
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    quantize_fp_tile_1x128_kernel<kFormat>
        <<<blocks, kThreads, 0, stream>>>(x, rows, cols, order, codes, scales);
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
