// Fine-grained fp quantization of a weight W [rows, cols] in 128x128 blocks (DeepSeek-V3
// §3.3.2), the FP8 GEMM's weight operands: the codes of W (forward), optionally the codes of
// W^T (the input gradient's TN operand; the same blocks transposed, so the same scales), and
// the scales in cuBLASLt's BLK128x128 order for W and for W^T (precision/scale_layout.h; the
// L4 padding entries are zero, written by the kernel). One thread block per 128x128 block.
// CPU twin: gnmr::quantize_fp_block_128x128 in src/precision/quantize_fine_grained.h (CPU
// scale order; blk128_from_blocks reorders, transposed or not); both call fine_grained_scale
// and quantize_fp_element (here quantize_fp_tile_code_words, kernels/fp_storage_conversion.cuh:
// the division by the block's reciprocal, the conversion instructions or the compile-time
// encoder, the same codes for every float: tests/precision, tests/gpu), so codes and scales are
// identical.
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

// 16 warps a block: a weight has few 128x128 blocks (256 for 2048 x 2048, under two per
// multiprocessor of an H200), so each block's warps are what hides the loads' latency.
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBlock = static_cast<int>(kFineGrainedTile);
constexpr int kPerLane = kBlock / 32;  // a lane's rows of a column of W^T

// A warp per row (per column of W^T), lane l holding elements 4l..4l+3 of it (a quad,
// kernels/quad_access.cuh: one 16-byte load, one 4-byte store of codes): every load and store
// of a warp touches adjacent elements, so W's reads, W's codes and, through the block's codes
// in shared memory, W^T's codes all coalesce (a thread per element writing W^T directly would
// write 32 rows `rows` bytes apart per store).
template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_block_128x128_kernel(const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                                     uint8_t* codes_t, float* scales, float* scales_t) {
  // The block's codes, [row][column]; 132-byte rows (33 words) put the 32 rows a warp reads of
  // one column in 32 different banks.
  __shared__ uint8_t block_codes[kBlock][kBlock + 4];
  const int64_t rb = blockIdx.y, cb = blockIdx.x;
  const int64_t row0 = rb * kBlock, col0 = cb * kBlock;
  const int height = static_cast<int>(rows - row0 < kBlock ? rows - row0 : kBlock);
  const int width = static_cast<int>(cols - col0 < kBlock ? cols - col0 : kBlock);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int c = 4 * lane;  // this lane's first column of the block
  // The thread's eight quads (rows warp, warp + 16, ...), all loads in flight at once and kept
  // for the codes: one read of W (a row at a time, each load waiting for the last, and a
  // second pass reading the block again from L2, moved W at a fifth of the memory's
  // bandwidth, ncu: 17 us for 2048 x 2048 on an H200, 11 us now). Rows past the edge are zeros
  // (|0| changes no absmax) and write nothing.
  constexpr int kRowsPerWarp = kBlock / kWarps;  // 8
  float values[4 * kRowsPerWarp];
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    float quad[4];
    load_quad<kQuads>(w + (row0 + r) * cols + col0 + c, r < height ? width - c : 0, quad);
    for (int k = 0; k < 4; ++k) values[4 * i + k] = quad[k];
  }
  const float scale = fine_grained_scale(block_max(abs_max(values)), kFormat);
  if (threadIdx.x == 0) {
    scales[blk128_scale_index(rb, cb, cols)] = scale;
    if (scales_t) scales_t[blk128_scale_index(cb, rb, rows)] = scale;
    // The L4 padding of the BLK128x128 grids: the last block of each grid row writes its zeros
    // (two memsets before each launch cost more device time than the small weights' kernels).
    const int64_t col_blocks = block_count(cols, kBlock), row_blocks = block_count(rows, kBlock);
    if (cb == col_blocks - 1) {
      for (int64_t p = col_blocks; p < blk128_scale_stride(cols); ++p) {
        scales[blk128_scale_index(rb, p, cols)] = 0.0f;
      }
    }
    if (scales_t && rb == row_blocks - 1) {
      for (int64_t p = row_blocks; p < blk128_scale_stride(rows); ++p) {
        scales_t[blk128_scale_index(cb, p, rows)] = 0.0f;
      }
    }
  }
  uint32_t words[kRowsPerWarp];
  quantize_fp_tile_code_words<kFormat>(values, tile_divisor(scale), words);
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r >= height) break;
    store_quad<kQuads>(codes + (row0 + r) * cols + col0 + c, width - c, words[i]);
    store_quad<true>(&block_codes[r][c], 4, words[i]);  // 4-byte aligned: 132-byte rows
  }
  if (!codes_t) return;
  __syncthreads();  // the block's codes are in shared memory
  for (int col = warp; col < width; col += kWarps) {
    for (int k = 0; k < kPerLane; ++k) {
      const int r = lane + 32 * k;
      if (r < height) codes_t[(col0 + col) * rows + row0 + r] = block_codes[r][col];
    }
  }
}

}  // namespace

void quantize_fp_block_128x128(const float* w, int64_t rows, int64_t cols, FpFormat format,
                               uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(block_count(cols, kBlock)),
                  static_cast<unsigned>(block_count(rows, kBlock)));
  const bool quads = quad_rows(w, cols, codes);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      quantize_fp_block_128x128_kernel<kFormat, kQuads>
          <<<grid, kThreads, 0, stream>>>(w, rows, cols, codes, codes_t, scales, scales_t);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
