// Fine-grained fp quantization of a weight W [rows, cols] in 128x128 blocks (DeepSeek-V3
// §3.3.2), the FP8 GEMM's weight operands: the codes of W (forward), optionally the codes of
// W^T (the input gradient's TN operand; the same blocks transposed, so the same scales), and
// the scales in cuBLASLt's BLK128x128 order for W and for W^T (precision/scale_layout.h; the
// L4 padding entries are zero, written by the kernel). One thread block per 128x128 block; one
// launch takes the blocks of up to kBatchWeights weights of one format, laid end to end
// (backend/launch_batch.h), so a step's weights cost a few launches, not one each.
// CPU twin: gnmr::quantize_fp_block_128x128 in src/precision/quantize_fine_grained.h (CPU
// scale order; blk128_from_blocks reorders, transposed or not); both call fine_grained_scale
// and quantize_fp_element (here quantize_fp_tile_code_words, kernels/fp_storage_conversion.cuh:
// the division by the block's reciprocal, the conversion instructions or the compile-time
// encoder, the same codes for every float: tests/precision, tests/gpu), so codes and scales are
// identical.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/launch_batch.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/quantize.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

// 16 warps a block: a weight has few 128x128 blocks (256 for 2048 x 2048, under two per
// multiprocessor of an H200), so each block's warps are what hides the loads' latency.
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBlock = static_cast<int>(kFineGrainedTile);
constexpr int kPerLane = kBlock / 32;  // a lane's rows of a column of W^T

// The weights of one launch, passed by value as a kernel parameter (~3.1 KB, under the 4 KB
// limit). first_block: each weight's first block, in the order of its own grid (column blocks
// fastest); [num] is one past the last. A step's 168 weights at llama2-1b-gpu, 256 to 704
// blocks a weight, take four launches (one more for the units GNMR routes to the recovery
// path's format) instead of 168 launches of one or two waves each, whose blocks all load, then
// all compute, then all store.
constexpr int kBatchWeights = 48;
struct BlockBatch {
  const float* w[kBatchWeights];
  uint8_t* codes[kBatchWeights];
  uint8_t* codes_t[kBatchWeights];  // null: no W^T
  float* scales[kBatchWeights];
  float* scales_t[kBatchWeights];
  int64_t rows[kBatchWeights];
  int64_t cols[kBatchWeights];
  int64_t first_block[kBatchWeights + 1];
  int num;
};
static_assert(sizeof(BlockBatch) <= 4096, "a kernel parameter of at most 4 KB");

// A warp per row (per column of W^T), lane l holding elements 4l..4l+3 of it (a quad,
// kernels/quad_access.cuh: one 16-byte load, one 4-byte store of codes): every load and store
// of a warp touches adjacent elements, so W's reads, W's codes and, through the block's codes
// in shared memory, W^T's codes all coalesce (a thread per element writing W^T directly would
// write 32 rows `rows` bytes apart per store).
template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads) quantize_fp_block_128x128_kernel(BlockBatch batch) {
  // The block's codes, [row][column]; 132-byte rows (33 words) put the 32 rows a warp reads of
  // one column in 32 different banks.
  __shared__ uint8_t block_codes[kBlock][kBlock + 4];
  const int t = batch_member(batch.first_block, batch.num, blockIdx.x);  // this block's weight
  const float* w = batch.w[t];
  uint8_t *codes = batch.codes[t], *codes_t = batch.codes_t[t];
  float *scales = batch.scales[t], *scales_t = batch.scales_t[t];
  const int64_t rows = batch.rows[t], cols = batch.cols[t];
  const int64_t col_blocks = block_count(cols, kBlock), row_blocks = block_count(rows, kBlock);
  const int64_t local = blockIdx.x - batch.first_block[t];
  const int64_t rb = local / col_blocks, cb = local % col_blocks;
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

// One launch over batch's weights, all of `format`, four-wide where kQuads.
void launch_block_batch(const BlockBatch& batch, FpFormat format, bool quads, cudaStream_t stream) {
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      quantize_fp_block_128x128_kernel<kFormat, kQuads>
          <<<static_cast<unsigned>(batch.first_block[batch.num]), kThreads, 0, stream>>>(batch);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void quantize_fp_block_128x128_batch(const std::vector<FpBlock128x128Weight>& weights,
                                     cudaStream_t stream) {
  // One launch per format and access width (the kernel's template arguments), each up to
  // kBatchWeights weights, in the order given.
  std::map<std::pair<FpFormat, bool>, std::vector<const FpBlock128x128Weight*>> kinds;
  for (const FpBlock128x128Weight& m : weights) {
    if (m.rows == 0 || m.cols == 0) continue;
    kinds[{m.format, quad_rows(m.w, m.cols, m.codes)}].push_back(&m);
  }
  for (const auto& kind : kinds) {
    const FpFormat format = kind.first.first;
    const bool quads = kind.first.second;
    BlockBatch batch{};
    auto launch = [&] {
      launch_block_batch(batch, format, quads, stream);
      batch = BlockBatch{};
    };
    for (const FpBlock128x128Weight* m : kind.second) {
      const int64_t blocks = block_count(m->rows, kBlock) * block_count(m->cols, kBlock);
      GNMR_CHECK(blocks <= int64_t{0x7FFFFFFF},
                 "quantize_fp_block_128x128: a weight of " + std::to_string(m->rows) + " x " +
                     std::to_string(m->cols) + " has more 128x128 blocks than a grid takes");
      if (batch.num == kBatchWeights ||
          batch.first_block[batch.num] + blocks > int64_t{0x7FFFFFFF}) {
        launch();
      }
      const int i = batch.num++;
      batch.w[i] = m->w;
      batch.codes[i] = m->codes;
      batch.codes_t[i] = m->codes_t;
      batch.scales[i] = m->scales;
      batch.scales_t[i] = m->scales_t;
      batch.rows[i] = m->rows;
      batch.cols[i] = m->cols;
      batch.first_block[i + 1] = batch.first_block[i] + blocks;
    }
    if (batch.num > 0) launch();
  }
}

void quantize_fp_block_128x128(const float* w, int64_t rows, int64_t cols, FpFormat format,
                               uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                               cudaStream_t stream) {
  quantize_fp_block_128x128_batch({{w, rows, cols, format, codes, scales, codes_t, scales_t}},
                                  stream);
}

}  // namespace gnmr::cuda
