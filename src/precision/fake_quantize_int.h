// Fused symmetric integer fake quantization, one scale per row: out = code * scale with
// scale = absmax(row) / qmax and code = round-nearest-even(x / scale) clamped to ±qmax.
// Bit for bit dequantize_int_groupwise(quantize_int_groupwise(x, {bits, kGroupRow})), without
// the packed buffer: what an int8 GEMM input looks like (recipe int8: per-token activations
// and output gradients, per-output-channel weights [out, in]).
// x, out: [rows, cols] fp32 row-major; out may equal x.
// CUDA twin: kernels/fake_quantize_int8_per_row.cu, a block per row over the same
// fake_quantize_int_element and scale.
#pragma once

#include <cmath>
#include <cstdint>

#include "precision/host_device.h"
#include "precision/int_formats.h"
#include "precision/quantize_groupwise.h"

namespace gnmr {

// One element, given its row's scale: the value its code stands for.
GNMR_HD_INLINE float fake_quantize_int_element(float x, float scale, int qmax) {
  return canonical_nan(static_cast<float>(quantize_int_nearest(x, scale, qmax)) * scale);
}

// One row: the row's absmax (a max, exact in any order: the GPU's block tree gives the same),
// then every element.
GNMR_HD_INLINE void fake_quantize_int_row(const float* x, int64_t cols, int bits, float* out) {
  float absmax = 0.0f;
  for (int64_t c = 0; c < cols; ++c) absmax = fmaxf(absmax, fabsf(x[c]));
  const float scale = groupwise_scale(absmax, bits);
  const int qmax = int_qmax(bits);
  for (int64_t c = 0; c < cols; ++c) out[c] = fake_quantize_int_element(x[c], scale, qmax);
}

inline void fake_quantize_int_per_row(const float* x, int64_t rows, int64_t cols, int bits,
                                      float* out) {
  GNMR_PRECISION_PARALLEL_FOR
  for (int64_t row = 0; row < rows; ++row) {
    fake_quantize_int_row(x + row * cols, cols, bits, out + row * cols);
  }
}

}  // namespace gnmr
