// Symmetric signed integers of 2..8 bits, their packed storage, and the per-element
// quantizers (nearest and stochastic) that quantize_groupwise.h and the CUDA kernels share.
//
// Symmetric range: a b-bit value lies in [-qmax, qmax] with qmax = 2^(b-1) - 1 (int8:
// ±127, int4: ±7, int2: ±1); the two's-complement code -2^(b-1) is never produced, so
// x and -x quantize to opposite codes. A value is stored as its b-bit two's-complement field.
//
// Packed storage (per row, see quantize_groupwise.h): 8 bits one per byte; 4 bits two per
// byte, element 2k in the low nibble; 2 bits four per byte, element 4k+j in bits 2j..2j+1;
// 3, 5, 6 and 7 bits one per byte (the next container; only stress tests use them).
#pragma once

#include <cmath>
#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

GNMR_HD_INLINE int int_qmax(int bits) {
  return (1 << (bits - 1)) - 1;
}

GNMR_HD_INLINE int clamp_symmetric_int(int value, int bits) {
  const int qmax = int_qmax(bits);
  return value > qmax ? qmax : (value < -qmax ? -qmax : value);
}

// Values held per storage byte for a bit width: 4 for 2 bits, 2 for 4 bits, else 1.
GNMR_HD_INLINE int int_codes_per_byte(int bits) {
  return bits == 2 ? 4 : (bits == 4 ? 2 : 1);
}

// log2 of int_codes_per_byte: the packing's divisions and remainders are shifts and masks (a
// 64-bit division is a ~70-instruction subroutine on the GPU, once per element).
GNMR_HD_INLINE int int_codes_per_byte_log2(int bits) {
  return bits == 2 ? 2 : (bits == 4 ? 1 : 0);
}

// value (already in [-qmax, qmax]) -> its b-bit two's-complement field in the low bits.
GNMR_HD_INLINE uint8_t encode_int_field(int value, int bits) {
  return static_cast<uint8_t>(static_cast<uint32_t>(value) & ((1u << bits) - 1u));
}

// b-bit two's-complement field -> value (sign-extended).
GNMR_HD_INLINE int decode_int_field(uint8_t field, int bits) {
  const int mask = (1 << bits) - 1;
  const int raw = field & mask;
  return raw >= (1 << (bits - 1)) ? raw - (1 << bits) : raw;
}

GNMR_HD_INLINE uint8_t pack_int4(int low, int high) {
  return static_cast<uint8_t>(encode_int_field(low, 4) | (encode_int_field(high, 4) << 4));
}
GNMR_HD_INLINE int unpack_int4_low(uint8_t byte) {
  return decode_int_field(byte & 0x0Fu, 4);
}
GNMR_HD_INLINE int unpack_int4_high(uint8_t byte) {
  return decode_int_field(byte >> 4, 4);
}

GNMR_HD_INLINE uint8_t pack_int2(int v0, int v1, int v2, int v3) {
  return static_cast<uint8_t>(encode_int_field(v0, 2) | (encode_int_field(v1, 2) << 2) |
                              (encode_int_field(v2, 2) << 4) | (encode_int_field(v3, 2) << 6));
}
GNMR_HD_INLINE int unpack_int2(uint8_t byte, int position) {
  return decode_int_field(static_cast<uint8_t>(byte >> (2 * position)), 2);
}

// Round-to-nearest-even quantization of x with a symmetric scale: clamp(rint(x / scale)).
// scale == 0 (an all-zero group) gives 0; NaN gives 0; ±inf saturates to ±qmax.
GNMR_HD_INLINE int quantize_int_nearest(float x, float scale, int qmax) {
  if (scale == 0.0f) return 0;
  const float scaled = x / scale;
  if (scaled != scaled) return 0;
  const float limit = static_cast<float>(qmax);
  const float rounded = rintf(scaled);  // default rounding mode: nearest, ties to even
  return static_cast<int>(rounded > limit ? limit : (rounded < -limit ? -limit : rounded));
}

// Stochastic rounding: with v = x / scale, returns floor(v) + 1 with probability
// v - floor(v) (uniform in [0, 1) decides), so E[code] = v and the result is unbiased
// (Gupta et al., "Deep Learning with Limited Numerical Precision", ICML 2015, §3).
// v - floor(v) is exact in float; with 24-bit uniforms the bias is below 2^-24 per element.
GNMR_HD_INLINE int quantize_int_stochastic(float x, float scale, int qmax, float uniform) {
  if (scale == 0.0f) return 0;
  const float scaled = x / scale;
  if (scaled != scaled) return 0;
  const float limit = static_cast<float>(qmax);
  if (scaled >= limit) return qmax;
  if (scaled <= -limit) return -qmax;
  const float lower = floorf(scaled);
  const float fraction = scaled - lower;
  const float rounded = uniform < fraction ? lower + 1.0f : lower;
  return static_cast<int>(rounded > limit ? limit : (rounded < -limit ? -limit : rounded));
}

// Saturating float -> int8 code of the symmetric range, nearest-even (scale applied by caller).
GNMR_HD_INLINE int8_t encode_int8_symmetric(float scaled) {
  return static_cast<int8_t>(quantize_int_nearest(scaled, 1.0f, 127));
}

}  // namespace gnmr
