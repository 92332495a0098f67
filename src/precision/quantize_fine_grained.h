// Fine-grained floating-point quantization as in DeepSeek-V3 (arXiv:2412.19437 §3.3.2):
// activations and output gradients in 1x128 tiles along the row, weights in 128x128 blocks,
// one fp32 scale per tile = absmax / format_max, so the tile's largest magnitude maps to the
// format's largest value. Formats: e4m3, e5m2 and the 6-/4-bit e3m2, e2m3, e2m1, which are
// stored as e4m3 codes (fp_format.h). Partial tiles at the right and bottom edges (rows or
// cols not a multiple of the block) get their own scale over the elements they hold.
//
// x, codes: [rows, cols] row-major (fp32 in, one byte per element out).
// scales: [ceil(rows / block_rows), ceil(cols / block_cols)] fp32, row-major.
// An all-zero tile has scale 0 and codes +0.
// CUDA twin: kernels/quantize_fp8_tile_1x128.cu (e4m3, 1x128) calls quantize_fp_element.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "precision/fp_format.h"
#include "precision/host_device.h"

namespace gnmr {

constexpr int64_t kFineGrainedTile = 128;

GNMR_HD_INLINE float fine_grained_scale(float absmax, FpFormat format) {
  return absmax / fp_format_max(format);
}

// Storage code of x in a tile with scale `scale`.
GNMR_HD_INLINE uint8_t quantize_fp_element(float x, float scale, FpFormat format) {
  if (scale == 0.0f) return 0;
  return encode_fp_storage(format, x / scale);
}

GNMR_HD_INLINE float dequantize_fp_element(uint8_t code, float scale, FpFormat format) {
  return decode_fp_storage(format, code) * scale;
}

inline size_t fp_blockwise_scale_count(int64_t rows, int64_t cols, int64_t block_rows,
                                       int64_t block_cols) {
  return static_cast<size_t>(((rows + block_rows - 1) / block_rows) *
                             ((cols + block_cols - 1) / block_cols));
}

// Largest |x| in the block starting at (row0, col0), clipped to the tensor.
inline float fp_block_absmax(const float* x, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                             int64_t block_rows, int64_t block_cols) {
  float absmax = 0.0f;
  for (int64_t r = row0; r < row0 + block_rows && r < rows; ++r) {
    for (int64_t c = col0; c < col0 + block_cols && c < cols; ++c) {
      absmax = fmaxf(absmax, fabsf(x[r * cols + c]));
    }
  }
  return absmax;
}

// Quantize with one scale per block_rows x block_cols block.
inline void quantize_fp_blockwise(const float* x, int64_t rows, int64_t cols, int64_t block_rows,
                                  int64_t block_cols, FpFormat format, uint8_t* codes,
                                  float* scales) {
  const int64_t block_grid_rows = (rows + block_rows - 1) / block_rows;
  const int64_t block_grid_cols = (cols + block_cols - 1) / block_cols;
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t br = 0; br < block_grid_rows; ++br) {
    for (int64_t bc = 0; bc < block_grid_cols; ++bc) {
      const int64_t row0 = br * block_rows, col0 = bc * block_cols;
      const float scale = fine_grained_scale(
          fp_block_absmax(x, rows, cols, row0, col0, block_rows, block_cols), format);
      scales[br * block_grid_cols + bc] = scale;
      for (int64_t r = row0; r < row0 + block_rows && r < rows; ++r) {
        for (int64_t c = col0; c < col0 + block_cols && c < cols; ++c) {
          codes[r * cols + c] = quantize_fp_element(x[r * cols + c], scale, format);
        }
      }
    }
  }
}

inline void dequantize_fp_blockwise(const uint8_t* codes, const float* scales, int64_t rows,
                                    int64_t cols, int64_t block_rows, int64_t block_cols,
                                    FpFormat format, float* out) {
  const int64_t block_grid_cols = (cols + block_cols - 1) / block_cols;
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = scales[(r / block_rows) * block_grid_cols + c / block_cols];
      out[r * cols + c] = dequantize_fp_element(codes[r * cols + c], scale, format);
    }
  }
}

// Quantize then dequantize in one pass: what a GEMM input looks like after the low-precision
// cast; the CPU reference GEMM path runs on this. out may equal x (in place).
inline void fake_quantize_fp_blockwise(const float* x, int64_t rows, int64_t cols,
                                       int64_t block_rows, int64_t block_cols, FpFormat format,
                                       float* out) {
  const int64_t block_grid_rows = (rows + block_rows - 1) / block_rows;
  const int64_t block_grid_cols = (cols + block_cols - 1) / block_cols;
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t br = 0; br < block_grid_rows; ++br) {
    for (int64_t bc = 0; bc < block_grid_cols; ++bc) {
      const int64_t row0 = br * block_rows, col0 = bc * block_cols;
      const float scale = fine_grained_scale(
          fp_block_absmax(x, rows, cols, row0, col0, block_rows, block_cols), format);
      for (int64_t r = row0; r < row0 + block_rows && r < rows; ++r) {
        for (int64_t c = col0; c < col0 + block_cols && c < cols; ++c) {
          const int64_t i = r * cols + c;
          out[i] = dequantize_fp_element(quantize_fp_element(x[i], scale, format), scale, format);
        }
      }
    }
  }
}

// ---- the two DeepSeek-V3 shapes --------------------------------------------------------------

// Activations / output gradients: scales [rows, ceil(cols / 128)].
inline void quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                                   uint8_t* codes, float* scales) {
  quantize_fp_blockwise(x, rows, cols, 1, kFineGrainedTile, format, codes, scales);
}
inline void dequantize_fp_tile_1x128(const uint8_t* codes, const float* scales, int64_t rows,
                                     int64_t cols, FpFormat format, float* out) {
  dequantize_fp_blockwise(codes, scales, rows, cols, 1, kFineGrainedTile, format, out);
}
inline void fake_quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                                        float* out) {
  fake_quantize_fp_blockwise(x, rows, cols, 1, kFineGrainedTile, format, out);
}

// Weights: scales [ceil(rows / 128), ceil(cols / 128)].
inline void quantize_fp_block_128x128(const float* w, int64_t rows, int64_t cols, FpFormat format,
                                      uint8_t* codes, float* scales) {
  quantize_fp_blockwise(w, rows, cols, kFineGrainedTile, kFineGrainedTile, format, codes, scales);
}
inline void dequantize_fp_block_128x128(const uint8_t* codes, const float* scales, int64_t rows,
                                        int64_t cols, FpFormat format, float* out) {
  dequantize_fp_blockwise(codes, scales, rows, cols, kFineGrainedTile, kFineGrainedTile, format,
                          out);
}
inline void fake_quantize_fp_block_128x128(const float* w, int64_t rows, int64_t cols,
                                           FpFormat format, float* out) {
  fake_quantize_fp_blockwise(w, rows, cols, kFineGrainedTile, kFineGrainedTile, format, out);
}

}  // namespace gnmr
