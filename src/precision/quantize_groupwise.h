// Group-wise symmetric integer quantization of activations (docs/DESIGN.md §4, recipe `actq`).
//
// x: [rows, cols] fp32, row-major; cols is the hidden dimension. Groups are G contiguous
// elements of a row (G divides cols), a whole row (kGroupRow, one scale per token) or the
// whole tensor (kGroupTensor, one scale). Per group: scale = absmax / qmax in fp32, code =
// round(x / scale) clamped to [-qmax, qmax]; an all-zero group has scale 0 and codes 0.
// scales: [rows, cols / G] fp32 (one float for kGroupTensor).
// packed: [rows, packed_row_bytes(cols, bits)] bytes; each row starts on a byte boundary and
// packs its codes as int_formats.h describes (4 bits two per byte, 2 bits four per byte,
// other widths one per byte).
// Rounding is nearest-even, or stochastic from counter_rng.h keyed by (seed, step, unit) and
// indexed by the element's flat index row * cols + col.
// CUDA twin: kernels/quantize_int_groupwise.cu, kernels/dequantize_int_groupwise.cu; both
// call the per-byte and per-element functions below, so their bytes equal these.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "precision/counter_rng.h"
#include "precision/host_device.h"
#include "precision/int_formats.h"
#include "util/error.h"

namespace gnmr {

constexpr int kGroupRow = -1;     // one scale per row (per token)
constexpr int kGroupTensor = -2;  // one scale for the whole tensor

struct GroupwiseSpec {
  int bits = 4;          // 2..8
  int group_size = 128;  // > 0 and divides cols, or kGroupRow, or kGroupTensor
  bool stochastic = false;
};

// Bytes one packed row takes.
GNMR_HD_INLINE int64_t packed_row_bytes(int64_t cols, int bits) {
  const int64_t per_byte = int_codes_per_byte(bits);
  return (cols + per_byte - 1) >> int_codes_per_byte_log2(bits);
}

// Scales per row (0 for kGroupTensor, whose single scale belongs to no row).
GNMR_HD_INLINE int64_t groups_per_row(int64_t cols, const GroupwiseSpec& spec) {
  if (spec.group_size == kGroupTensor) return 0;
  if (spec.group_size == kGroupRow) return 1;
  return cols / spec.group_size;
}

// Index into `scales` of the group holding element (row, col). The divisions within a row are
// 32-bit (validate_groupwise_spec holds a row under 2^31 elements): a GPU runs this per element.
GNMR_HD_INLINE int64_t group_scale_index(int64_t row, int64_t col, int64_t cols,
                                         const GroupwiseSpec& spec) {
  if (spec.group_size == kGroupTensor) return 0;
  if (spec.group_size == kGroupRow) return row;
  const int32_t groups = static_cast<int32_t>(cols) / spec.group_size;
  return row * groups + static_cast<int32_t>(col) / spec.group_size;
}

// Symmetric scale of a group with largest magnitude `absmax`.
GNMR_HD_INLINE float groupwise_scale(float absmax, int bits) {
  return absmax / static_cast<float>(int_qmax(bits));
}

// The code of value x, the element at flat index `index` (row * cols + col), in a group of
// scale `scale`: nearest-even, or stochastic from the element's own counter. Every quantizer of
// both backends takes its codes from here.
GNMR_HD_INLINE int quantize_int_groupwise_code(float x, int64_t index, float scale,
                                               const GroupwiseSpec& spec, const RngKey& key) {
  const int qmax = int_qmax(spec.bits);
  return spec.stochastic
             ? quantize_int_stochastic(x, scale, qmax,
                                       counter_rng_uniform(key, static_cast<uint64_t>(index)))
             : quantize_int_nearest(x, scale, qmax);
}

// Storage byte `byte_in_row` of row `row`: quantizes its 1, 2 or 4 elements of x with the
// already computed scales; bits past the row's end stay zero.
GNMR_HD_INLINE uint8_t quantize_int_groupwise_byte(const float* x, int64_t row, int64_t cols,
                                                   int64_t byte_in_row, const GroupwiseSpec& spec,
                                                   const float* scales, const RngKey& key) {
  const int per_byte = int_codes_per_byte(spec.bits);
  uint32_t byte = 0;
  for (int j = 0; j < per_byte; ++j) {
    const int64_t col = byte_in_row * per_byte + j;
    if (col >= cols) break;
    const int64_t index = row * cols + col;
    const float scale = scales[group_scale_index(row, col, cols, spec)];
    const int code = quantize_int_groupwise_code(x[index], index, scale, spec, key);
    byte |= static_cast<uint32_t>(encode_int_field(code, spec.bits)) << (j * spec.bits);
  }
  return static_cast<uint8_t>(byte);
}

// The bits of four consecutive codes, of elements col .. col + 3 with col a multiple of 4, as
// their 1, 2 or 4 storage bytes hold them (the first byte in the low 8 bits): element col + j
// sits in byte j / per_byte at field j % per_byte, as quantize_int_groupwise_byte packs it.
GNMR_HD_INLINE uint32_t pack_int_codes_x4(const int codes[4], int bits) {
  const int per_byte_log2 = int_codes_per_byte_log2(bits);
  const int field_mask = int_codes_per_byte(bits) - 1;
  uint32_t word = 0;
  for (int j = 0; j < 4; ++j) {
    word |= static_cast<uint32_t>(encode_int_field(codes[j], bits))
            << (8 * (j >> per_byte_log2) + bits * (j & field_mask));
  }
  return word;
}

// The signed code of element (row, col) in packed storage.
GNMR_HD_INLINE int packed_int_code(const uint8_t* packed, int64_t row, int64_t col, int64_t cols,
                                   int bits) {
  const int per_byte = int_codes_per_byte(bits);
  const uint8_t byte =
      packed[row * packed_row_bytes(cols, bits) + (col >> int_codes_per_byte_log2(bits))];
  return decode_int_field(static_cast<uint8_t>(byte >> ((col & (per_byte - 1)) * bits)), bits);
}

GNMR_HD_INLINE float dequantize_int_groupwise_element(const uint8_t* packed, const float* scales,
                                                      int64_t row, int64_t col, int64_t cols,
                                                      const GroupwiseSpec& spec) {
  return canonical_nan(static_cast<float>(packed_int_code(packed, row, col, cols, spec.bits)) *
                       scales[group_scale_index(row, col, cols, spec)]);
}

// ---- host-side API -------------------------------------------------------------------------

// Throws a Config error naming the bad field and its fix.
inline void validate_groupwise_spec(int64_t cols, const GroupwiseSpec& spec) {
  if (spec.bits < 2 || spec.bits > 8) {
    throw Error(ErrorKind::Config, "precision: group-wise quantization bits = " +
                                       std::to_string(spec.bits) + " is out of range (use 2..8)");
  }
  if (cols > int64_t{INT32_MAX}) {  // group_scale_index divides within a row in 32 bits
    throw Error(ErrorKind::Config, "precision: group-wise quantization of rows of " +
                                       std::to_string(cols) + " elements (at most 2^31 - 1)");
  }
  if (spec.group_size == kGroupRow || spec.group_size == kGroupTensor) return;
  if (spec.group_size <= 0 || (cols > 0 && cols % spec.group_size != 0)) {
    throw Error(ErrorKind::Config, "precision: group size " + std::to_string(spec.group_size) +
                                       " does not divide the row length " + std::to_string(cols) +
                                       " (use a positive divisor, \"row\" or \"tensor\")");
  }
}

// "row" -> kGroupRow, "tensor" -> kGroupTensor, "128" -> 128.
inline int parse_group_size(const std::string& text) {
  if (text == "row") return kGroupRow;
  if (text == "tensor") return kGroupTensor;
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value <= 0) {
    throw Error(ErrorKind::Config, "precision: group size \"" + text +
                                       "\" is not a positive integer, \"row\" or \"tensor\"");
  }
  return value;
}

inline size_t packed_bytes(int64_t rows, int64_t cols, const GroupwiseSpec& spec) {
  return static_cast<size_t>(rows * packed_row_bytes(cols, spec.bits));
}

inline size_t scale_count(int64_t rows, int64_t cols, const GroupwiseSpec& spec) {
  if (spec.group_size == kGroupTensor) return 1;
  return static_cast<size_t>(rows * groups_per_row(cols, spec));
}

// Writes packed[packed_bytes(...)] and scales[scale_count(...)]. `key` is used only when
// spec.stochastic. Rows are independent, so the result does not depend on thread count.
inline void quantize_int_groupwise(const float* x, int64_t rows, int64_t cols,
                                   const GroupwiseSpec& spec, uint8_t* packed, float* scales,
                                   RngKey key = RngKey{}) {
  validate_groupwise_spec(cols, spec);
  const int64_t group = spec.group_size > 0 ? spec.group_size : cols;
  const int64_t groups = cols > 0 ? cols / group : 0;
  std::vector<float> row_absmax(spec.group_size == kGroupTensor ? rows : 0, 0.0f);
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      float absmax = 0.0f;
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        absmax = fmaxf(absmax, fabsf(x[row * cols + c]));
      }
      if (spec.group_size == kGroupTensor) {
        row_absmax[row] = absmax;
      } else {
        scales[row * groups + g] = groupwise_scale(absmax, spec.bits);
      }
    }
  }
  if (spec.group_size == kGroupTensor) {
    float absmax = 0.0f;
    for (float value : row_absmax) absmax = fmaxf(absmax, value);
    scales[0] = groupwise_scale(absmax, spec.bits);
  }
  const int64_t row_bytes = packed_row_bytes(cols, spec.bits);
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t b = 0; b < row_bytes; ++b) {
      packed[row * row_bytes + b] = quantize_int_groupwise_byte(x, row, cols, b, spec, scales, key);
    }
  }
}

// out: [rows, cols] fp32 = code * scale.
inline void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                                     int64_t cols, const GroupwiseSpec& spec, float* out) {
  validate_groupwise_spec(cols, spec);
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t col = 0; col < cols; ++col) {
      out[row * cols + col] =
          dequantize_int_groupwise_element(packed, scales, row, col, cols, spec);
    }
  }
}

// A quantized tensor that owns its storage; bytes() is what a saved activation costs.
struct GroupwiseQuantized {
  int64_t rows = 0;
  int64_t cols = 0;
  GroupwiseSpec spec;
  std::vector<uint8_t> packed;
  std::vector<float> scales;

  size_t bytes() const { return packed.size() + scales.size() * sizeof(float); }
};

inline GroupwiseQuantized quantize_int_groupwise(const float* x, int64_t rows, int64_t cols,
                                                 const GroupwiseSpec& spec, RngKey key = RngKey{}) {
  GroupwiseQuantized q;
  q.rows = rows;
  q.cols = cols;
  q.spec = spec;
  validate_groupwise_spec(cols, spec);
  q.packed.resize(packed_bytes(rows, cols, spec));
  q.scales.resize(scale_count(rows, cols, spec));
  quantize_int_groupwise(x, rows, cols, spec, q.packed.data(), q.scales.data(), key);
  return q;
}

inline void dequantize_int_groupwise(const GroupwiseQuantized& q, float* out) {
  dequantize_int_groupwise(q.packed.data(), q.scales.data(), q.rows, q.cols, q.spec, out);
}

}  // namespace gnmr
