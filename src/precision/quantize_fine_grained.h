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
// CUDA twins: kernels/quantize_fp_tile_1x128.cu, quantize_fp_block_128x128.cu,
// quantize_fp_tile_128x1_transposed.cu and quantize_fp_tile_1x128_and_transposed.cu (every
// format) call quantize_fp_tile_code_words (kernels/fp_storage_conversion.cuh), which gives
// quantize_fp_element's codes by the fp8 conversion instructions (e4m3, e3m2, e2m3) or by
// quantize_fp_tile_elements (e5m2, e2m1, tiles without a reciprocal).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "precision/fp_format.h"
#include "precision/fp_format_dispatch.h"
#include "precision/host_device.h"

namespace gnmr {

constexpr int64_t kFineGrainedTile = 128;

GNMR_HD_INLINE float fine_grained_scale(float absmax, FpFormat format) {
  return absmax / fp_format_max(format);
}

// Storage code of x in a tile with scale `scale`. A NaN quotient (x NaN, or inf / an inf scale)
// is made the canonical NaN first: its sign, which picks the code (S.1111.111 in e4m3, ±max in
// the fp6 / fp4 formats, which saturate NaN), differs between x86 and the GPU otherwise.
GNMR_HD_INLINE uint8_t quantize_fp_element(float x, float scale, FpFormat format) {
  if (scale == 0.0f) return 0;
  return encode_fp_storage(format, canonical_nan(x / scale));
}

GNMR_HD_INLINE float dequantize_fp_element(uint8_t code, float scale, FpFormat format) {
  return canonical_nan(decode_fp_storage(format, code) * scale);
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

// One element through quantize + dequantize, the reference the fast path below must match.
GNMR_HD_INLINE float fake_quantize_fp_element(float x, float scale, FpFormat format) {
  return dequantize_fp_element(quantize_fp_element(x, scale, format), scale, format);
}

// Mantissa bits, exponent bias and largest finite value of each format (OCP FP8 / MX).
struct MinifloatShape {
  int mantissa_bits;
  int exponent_bias;
  float max_value;
};
GNMR_HOST_DEVICE constexpr MinifloatShape minifloat_shape(FpFormat format) {
  return format == FpFormat::kE4M3   ? MinifloatShape{3, 7, kFp8E4m3Max}
         : format == FpFormat::kE5M2 ? MinifloatShape{2, 15, kFp8E5m2Max}
         : format == FpFormat::kE3M2 ? MinifloatShape{2, 3, kFp6E3m2Max}
         : format == FpFormat::kE2M3 ? MinifloatShape{3, 1, kFp6E2m3Max}
                                     : MinifloatShape{1, 1, kFp4E2m1Max};
}

// fake_quantize_fp_element with the format fixed at compile time and the rounding done on the
// float's bits, without building storage codes: ~10x faster on the CPU, where the fake
// quantizer was most of an fp8mix step. Bit-identical to the reference (tests/precision
// compare them over a stride of all float bit patterns and random tiles). The CUDA twin
// kernels/fake_quantize_fp_blockwise.cu calls it too:
// - scale 0 (an all-zero tile): the reference decodes code 0, so +0.
// - NaN: each format's NaN rule lives in the storage codecs; defer to the reference. Every NaN
//   result, this one and 0 times an inf scale below, is canonical_nan's one NaN.
// - normal range of the format: round the float's mantissa to M bits, nearest, ties to even;
//   a carry into the exponent is the next representable value, as in the codecs.
// - subnormal range (|v| < 2^(1-B)): adding C = 2^(24-B-M) makes the float adder round |v| to
//   a multiple of the subnormal step 2^(1-B-M), ties to even; subtracting C is exact.
// - past the largest finite value (infinity too): saturate, as every fine-grained storage does.
// The last three are round_to_format_bits, shared with encode_fp_storage_fast below.
template <FpFormat kFormat>
GNMR_HD_INLINE uint32_t round_to_format_bits(uint32_t abs_bits) {
  constexpr MinifloatShape shape = minifloat_shape(kFormat);
  constexpr int dropped_bits = 23 - shape.mantissa_bits;
  constexpr uint32_t dropped_mask = (1u << dropped_bits) - 1u;
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(1 - shape.exponent_bias + 127) << 23;
  constexpr uint32_t subnormal_carrier_bits =
      static_cast<uint32_t>(24 - shape.exponent_bias - shape.mantissa_bits + 127) << 23;
  uint32_t rounded_bits;
  if (abs_bits >= min_normal_bits) {
    const uint32_t round_up = (dropped_mask >> 1) + ((abs_bits >> dropped_bits) & 1u);
    rounded_bits = (abs_bits + round_up) & ~dropped_mask;
  } else {
    const float carrier = float_from_bits(subnormal_carrier_bits);
    rounded_bits = float_bits((float_from_bits(abs_bits) + carrier) - carrier);
  }
  const uint32_t max_bits = float_bits(shape.max_value);
  return rounded_bits > max_bits ? max_bits : rounded_bits;
}

template <FpFormat kFormat>
GNMR_HD_INLINE float fake_quantize_fp_element_fast(float x, float scale) {
  if (scale == 0.0f) return 0.0f;
  const uint32_t bits = float_bits(x / scale);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return fake_quantize_fp_element(x, scale, kFormat);
  const uint32_t rounded_bits = round_to_format_bits<kFormat>(abs_bits);
  // 0 * an inf scale (a tile holding inf) is NaN.
  return canonical_nan(float_from_bits(rounded_bits | (bits & 0x80000000u)) * scale);
}

// encode_fp_storage_fast's finite-or-infinite case, from the float's bits (not a NaN's).
template <FpFormat kFormat>
GNMR_HD_INLINE uint8_t encode_fp_storage_non_nan(uint32_t bits) {
  // The storage format: e5m2 for kE5M2, e4m3 for every other.
  constexpr bool e5m2 = kFormat == FpFormat::kE5M2;
  constexpr int storage_mantissa = e5m2 ? 2 : 3;
  constexpr int storage_bias = e5m2 ? 15 : 7;
  constexpr uint32_t storage_min_normal_bits = static_cast<uint32_t>(1 - storage_bias + 127) << 23;
  // 2^(B + M - 1): a storage subnormal times this is its code (an integer below 2^M).
  constexpr uint32_t subnormal_code_unit_bits =
      static_cast<uint32_t>(storage_bias + storage_mantissa - 1 + 127) << 23;
  // The fp6 / fp4 formats' smallest step, 2^(1 - B - M), is a normal e4m3 value: their
  // nonzero values never take the storage's subnormal path (a float-to-int conversion, a
  // quarter-rate instruction on the GPU), only zero needs its own code.
  constexpr MinifloatShape shape = minifloat_shape(kFormat);
  constexpr bool storage_normal_only =
      1 - shape.exponent_bias - shape.mantissa_bits >= 1 - storage_bias;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint32_t rounded_bits = round_to_format_bits<kFormat>(abs_bits);
  const uint32_t exponent = (rounded_bits >> 23) - (127 - storage_bias);
  const uint32_t normal_magnitude =
      (exponent << storage_mantissa) |
      ((rounded_bits >> (23 - storage_mantissa)) & ((1u << storage_mantissa) - 1u));
  uint32_t magnitude;
  if constexpr (storage_normal_only) {
    magnitude = rounded_bits == 0 ? 0u : normal_magnitude;
  } else if (rounded_bits >= storage_min_normal_bits) {
    magnitude = normal_magnitude;
  } else {  // exact: the value is a multiple of the storage's subnormal step, the product a power
            // of two's multiple of it
    magnitude = static_cast<uint32_t>(float_from_bits(rounded_bits) *
                                      float_from_bits(subnormal_code_unit_bits));
  }
  return static_cast<uint8_t>(((bits >> 24) & 0x80u) | magnitude);
}

// encode_fp_storage with the format fixed at compile time, from the float's bits: |v| rounded
// to the format as fake_quantize_fp_element_fast rounds it (NaN deferred to the codecs), then
// the storage code of that value, which holds it exactly (an e4m3 code, an e5m2 code for
// kE5M2): the exponent rebiased and the top mantissa bits, or for a storage subnormal the
// value as a multiple of the storage's subnormal step. Bit-identical to encode_fp_storage for
// every float (tests/precision). Its core, encode_fp_storage_non_nan, is what the GPU's FP
// quantizer kernels run per element where no conversion instruction fits (e5m2, e2m1:
// quantize_fp_tile_elements): the codecs' general rounding (twice for the fp6 / fp4 formats: to
// the format, then to e4m3) made them compute-bound.
template <FpFormat kFormat>
GNMR_HD_INLINE uint8_t encode_fp_storage_fast(float v) {
  const uint32_t bits = float_bits(v);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return encode_fp_storage(kFormat, v);
  return encode_fp_storage_non_nan<kFormat>(bits);
}

// quantize_fp_element with the format fixed at compile time, through encode_fp_storage_fast:
// the same codes.
template <FpFormat kFormat>
GNMR_HD_INLINE uint8_t quantize_fp_element_fast(float x, float scale) {
  if (scale == 0.0f) return 0;
  return encode_fp_storage_fast<kFormat>(canonical_nan(x / scale));
}

// A tile's scale and, where quotient_by_reciprocal gives the division's codes, its reciprocal;
// 0 elsewhere: a scale of 0, inf or NaN, past 2^125 (the reciprocal would not be a normal
// float) or below 2^-80 (see quotient_by_reciprocal). No real tile has a scale that small
// (its largest magnitude under 2^-71); such tiles divide.
struct TileDivisor {
  float scale;
  float reciprocal;
};
GNMR_HD_INLINE TileDivisor tile_divisor(float scale) {
  const bool by_reciprocal = scale >= 0x1p-80f && scale <= 0x1p125f;
  return {scale, by_reciprocal ? 1.0f / scale : 0.0f};
}

// x / d.scale in three operations from the tile's reciprocal, where each IEEE division takes
// ten, one of them a branch to a slow path. Markstein's theorem: with r = RN(1 / s) and
// q0 = RN(x r), within an ulp of x / s, the remainder x - q0 s is exact in one fma and
// RN(q0 + remainder r) = RN(x / s). That holds for |x| >= 2^-100; below, the remainder's low
// bits fall under 2^-149 and the result can be off in its last bits, but with a scale of
// 2^-80 or more such a quotient is under 2^-20, which every format codes as a signed zero
// either way. q0 is the quotient itself where the correction would spoil it: an infinite x
// (or quotient) makes the remainder NaN, and a zero q0 (x = -0 among them) would come out +0
// (-0 + +0). tests/precision compare it with the division for every float x at scales across
// the range, and the codes it gives for every format.
GNMR_HD_INLINE float quotient_by_reciprocal(float x, TileDivisor d) {
  const float q0 = x * d.reciprocal;
  const float remainder = fmaf(-q0, d.scale, x);
  const float q1 = fmaf(remainder, d.reciprocal, q0);
  return q1 == q1 && q0 != 0.0f ? q1 : q0;
}

// The code quantize_fp_element gives every NaN quotient: canonical_nan's, whatever the NaN.
template <FpFormat kFormat>
GNMR_HD_INLINE uint8_t fp_nan_code() {
  return encode_fp_storage(kFormat, float_from_bits(0x7FC00000u));
}

// quantize_fp_element_fast for a tile whose divisor has a reciprocal, the same code: the
// quotient by the reciprocal, and a NaN quotient's code (nan_code = fp_nan_code<kFormat>())
// chosen, not branched to.
template <FpFormat kFormat>
GNMR_HD_INLINE uint8_t quantize_fp_element_by_reciprocal(float x, TileDivisor d, uint8_t nan_code) {
  const uint32_t bits = float_bits(quotient_by_reciprocal(x, d));
  const uint8_t code = encode_fp_storage_non_nan<kFormat>(bits);
  return (bits & 0x7FFFFFFFu) > 0x7F800000u ? nan_code : code;
}

// quantize_fp_element_fast of a lane's elements of one tile, the same codes: by the reciprocal
// where the tile has one (the branch is per tile, not per element), else by the division.
template <FpFormat kFormat, int kCount>
GNMR_HD_INLINE void quantize_fp_tile_elements(const float (&x)[kCount], TileDivisor d,
                                              uint8_t (&codes)[kCount]) {
  if (d.reciprocal != 0.0f) {
    const uint8_t nan_code = fp_nan_code<kFormat>();
    for (int k = 0; k < kCount; ++k) {
      codes[k] = quantize_fp_element_by_reciprocal<kFormat>(x[k], d, nan_code);
    }
  } else {
    for (int k = 0; k < kCount; ++k) codes[k] = quantize_fp_element_fast<kFormat>(x[k], d.scale);
  }
}

// One band of block_rows rows of fake_quantize_fp_blockwise, the format fixed at compile time.
// Two passes, each reading x row by row: the absmax of every block of the band, then the
// elements. Walking rows keeps
// the tall 128x1 blocks of the weight-gradient GEMM (one scale per column of a 128-row band)
// contiguous; a block-by-block walk strides by `cols` there. Those one-column blocks get their
// own loops: through the general per-block loop (one element per block) they run ~10x slower.
template <FpFormat kFormat>
inline void fake_quantize_fp_band(const float* x, int64_t rows, int64_t cols, int64_t block_rows,
                                  int64_t block_cols, int64_t br, float* band_scales, float* out) {
  // band br: rows [br * block_rows, min(rows, (br + 1) * block_rows)); band_scales: its
  // ceil(cols / block_cols) block scales.
  const int64_t block_grid_cols = (cols + block_cols - 1) / block_cols;
  const int64_t row_end = (br + 1) * block_rows < rows ? (br + 1) * block_rows : rows;
  for (int64_t bc = 0; bc < block_grid_cols; ++bc) band_scales[bc] = 0.0f;
  for (int64_t r = br * block_rows; r < row_end; ++r) {
    const float* x_row = x + r * cols;
    if (block_cols == 1) {
      for (int64_t c = 0; c < cols; ++c) {
        const float magnitude = fabsf(x_row[c]);
        // Same result as fmaxf for a non-NaN running max: a NaN element never wins.
        band_scales[c] = magnitude > band_scales[c] ? magnitude : band_scales[c];
      }
      continue;
    }
    for (int64_t bc = 0; bc < block_grid_cols; ++bc) {
      const int64_t col_end = (bc + 1) * block_cols < cols ? (bc + 1) * block_cols : cols;
      float absmax = band_scales[bc];
      for (int64_t c = bc * block_cols; c < col_end; ++c) {
        const float magnitude = fabsf(x_row[c]);
        absmax = magnitude > absmax ? magnitude : absmax;
      }
      band_scales[bc] = absmax;
    }
  }
  for (int64_t bc = 0; bc < block_grid_cols; ++bc) {
    band_scales[bc] = fine_grained_scale(band_scales[bc], kFormat);
  }
  for (int64_t r = br * block_rows; r < row_end; ++r) {
    const float* x_row = x + r * cols;
    float* out_row = out + r * cols;
    if (block_cols == 1) {
      for (int64_t c = 0; c < cols; ++c) {
        out_row[c] = fake_quantize_fp_element_fast<kFormat>(x_row[c], band_scales[c]);
      }
      continue;
    }
    for (int64_t bc = 0; bc < block_grid_cols; ++bc) {
      const int64_t col_end = (bc + 1) * block_cols < cols ? (bc + 1) * block_cols : cols;
      const float scale = band_scales[bc];
      for (int64_t c = bc * block_cols; c < col_end; ++c) {
        out_row[c] = fake_quantize_fp_element_fast<kFormat>(x_row[c], scale);
      }
    }
  }
}

// Bands [band_begin, band_end) of fake_quantize_fp_blockwise, one after the other; block_scales
// holds every band's scales ([bands, ceil(cols / block_cols)]). The CPU backend runs band
// ranges on its threads through a copy compiled per instruction set (src/backend/cpu/quantize.cpp).
inline void fake_quantize_fp_bands(const float* x, int64_t rows, int64_t cols, int64_t block_rows,
                                   int64_t block_cols, FpFormat format, int64_t band_begin,
                                   int64_t band_end, float* block_scales, float* out) {
  const int64_t block_grid_cols = (cols + block_cols - 1) / block_cols;
  for (int64_t br = band_begin; br < band_end; ++br) {
    float* band_scales = block_scales + br * block_grid_cols;
    dispatch_fp_format(format, [&](auto f) {
      fake_quantize_fp_band<decltype(f)::value>(x, rows, cols, block_rows, block_cols, br,
                                                band_scales, out);
    });
  }
}

// Quantize then dequantize in one pass: what a GEMM input looks like after the low-precision
// cast; the CPU reference GEMM path runs on this. out may equal x (in place). Bit-identical to
// quantize_fp_blockwise followed by dequantize_fp_blockwise (tests/precision).
inline void fake_quantize_fp_blockwise(const float* x, int64_t rows, int64_t cols,
                                       int64_t block_rows, int64_t block_cols, FpFormat format,
                                       float* out) {
  std::vector<float> block_scales(fp_blockwise_scale_count(rows, cols, block_rows, block_cols));
  const int64_t bands = (rows + block_rows - 1) / block_rows;
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t br = 0; br < bands; ++br) {
    fake_quantize_fp_bands(x, rows, cols, block_rows, block_cols, format, br, br + 1,
                           block_scales.data(), out);
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
