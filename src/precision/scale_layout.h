// Where the scale of each block lives: gnmr's CPU order and the two orders cuBLASLt's
// block-scaled FP8 GEMMs read (cuBLAS docs §3.1.4.5.1 "Scaling factors layouts"; the TN
// mapping of our GEMMs is src/backend/cuda/gemm_plan.h).
//
// An FP8 operand is stored as cuBLASLt reads it under TN: row-major [rows, K], the reduction
// dimension K innermost (a column-major K x rows matrix), split into L = ceil(K / 128) blocks
// along K.
//  - CPU order (quantize_fp_blockwise): the block grid row-major, [ceil(rows / br), ceil(K / bc)].
//  - VEC128_32F ("1 x 128", activations and output gradients): one scale per (row, k-block),
//    "M-major": the row index fastest, scale(row, kb) at row + kb * rows.
//  - BLK128x128_32F (weights): one scale per (128-row block, k-block), "K-major" with the
//    stride between consecutive row blocks L4 = round_up(L, 4): scale(rb, kb) at kb + rb * L4;
//    the padding entries are never read but must be written (zero).
// Host + device, so a quantize kernel can write cuBLASLt's order directly and a CPU test can
// check every index.
#pragma once

#include <cstdint>
#include <vector>

#include "precision/host_device.h"

namespace gnmr {

constexpr int64_t kScaleBlock = 128;  // the only block length cuBLASLt's FP32-scale modes take

GNMR_HD_INLINE int64_t block_count(int64_t extent, int64_t block) {
  return (extent + block - 1) / block;
}

// ---- VEC128_32F ----
GNMR_HD_INLINE int64_t vec128_scale_index(int64_t row, int64_t k_block, int64_t rows) {
  return row + k_block * rows;
}
GNMR_HD_INLINE int64_t vec128_scale_count(int64_t rows, int64_t k) {
  return rows * block_count(k, kScaleBlock);
}

// ---- BLK128x128_32F ----
GNMR_HD_INLINE int64_t blk128_scale_stride(int64_t k) {
  return (block_count(k, kScaleBlock) + 3) / 4 * 4;
}
GNMR_HD_INLINE int64_t blk128_scale_index(int64_t row_block, int64_t k_block, int64_t k) {
  return k_block + row_block * blk128_scale_stride(k);
}
GNMR_HD_INLINE int64_t blk128_scale_count(int64_t rows, int64_t k) {
  return block_count(rows, kScaleBlock) * blk128_scale_stride(k);
}

// ---- from the CPU's order (host; the CPU emulation of the GPU path and the tests) ----

// Scales of a [rows, k] operand quantized in 1 x 128 tiles along k (CPU grid [rows, L]).
inline std::vector<float> vec128_from_row_tiles(const float* cpu_scales, int64_t rows, int64_t k) {
  const int64_t blocks = block_count(k, kScaleBlock);
  std::vector<float> out(static_cast<size_t>(vec128_scale_count(rows, k)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kb = 0; kb < blocks; ++kb) {
      out[static_cast<size_t>(vec128_scale_index(r, kb, rows))] = cpu_scales[r * blocks + kb];
    }
  }
  return out;
}

// Scales of the transpose of a [k, rows] tensor quantized in 128 x 1 tiles along k (CPU grid
// [L, rows]): the weight-gradient operands x^T and dy^T. The CPU grid already is VEC128's
// order; this copies it so that the caller does not depend on that coincidence.
inline std::vector<float> vec128_from_column_tiles(const float* cpu_scales, int64_t rows,
                                                   int64_t k) {
  const int64_t blocks = block_count(k, kScaleBlock);
  std::vector<float> out(static_cast<size_t>(vec128_scale_count(rows, k)));
  for (int64_t kb = 0; kb < blocks; ++kb) {
    for (int64_t r = 0; r < rows; ++r) {
      out[static_cast<size_t>(vec128_scale_index(r, kb, rows))] = cpu_scales[kb * rows + r];
    }
  }
  return out;
}

// Scales of a [rows, k] operand quantized in 128 x 128 blocks (CPU grid [ceil(rows/128), L]);
// `transposed`: the operand is the transpose of the tensor the CPU quantized, i.e. the CPU grid
// is [L, ceil(rows/128)] (W^T for the input-gradient GEMM: same blocks, transposed grid).
inline std::vector<float> blk128_from_blocks(const float* cpu_scales, int64_t rows, int64_t k,
                                             bool transposed) {
  const int64_t row_blocks = block_count(rows, kScaleBlock), k_blocks = block_count(k, kScaleBlock);
  std::vector<float> out(static_cast<size_t>(blk128_scale_count(rows, k)), 0.0f);
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const float s =
          transposed ? cpu_scales[kb * row_blocks + rb] : cpu_scales[rb * k_blocks + kb];
      out[static_cast<size_t>(blk128_scale_index(rb, kb, k))] = s;
    }
  }
  return out;
}

}  // namespace gnmr
