// 6- and 4-bit floating point, OCP Microscaling Formats (MX) Specification v1.0 §5.3.3:
//   FP6 E3M2: bias 3, max normal ±28;   FP6 E2M3: bias 1, max normal ±7.5;
//   FP4 E2M1: bias 1, max normal ±6.
// None has inf or NaN: every code is a finite number. A code is held in the low bits of a
// uint8_t with the sign in the top bit of the format (bit 5 for fp6, bit 3 for fp4).
// Encoders round to nearest, ties to even (subnormals included), keep the sign of zero and
// saturate: finite overflow and ±inf give ±max (the MX spec's conversion, §6.3).
// NaN input (the spec leaves it implementation-defined) gives ±max with the NaN's sign
// bit: a non-finite activation stays a large value a loss-spike check can still see,
// instead of being silently zeroed.
#pragma once

#include <cstdint>

#include "precision/host_device.h"
#include "precision/minifloat.h"

namespace gnmr {

constexpr float kFp6E3m2Max = 28.0f;
constexpr float kFp6E2m3Max = 7.5f;
constexpr float kFp4E2m1Max = 6.0f;
constexpr uint8_t kFp6MaxMagnitudeCode = 0x1F;
constexpr uint8_t kFp4MaxMagnitudeCode = 0x07;

// Shared by the three formats: sign_shift is the format's width minus one.
GNMR_HD_INLINE uint8_t encode_saturating_minifloat(float value, int mantissa_bits,
                                                   int exponent_bias, uint32_t max_magnitude,
                                                   int sign_shift) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 31) << sign_shift;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return static_cast<uint8_t>(sign | max_magnitude);  // NaN
  uint32_t magnitude = round_magnitude_to_minifloat(abs_bits, mantissa_bits, exponent_bias);
  if (magnitude > max_magnitude) magnitude = max_magnitude;
  return static_cast<uint8_t>(sign | magnitude);
}

GNMR_HD_INLINE uint8_t encode_fp6_e3m2(float value) {
  return encode_saturating_minifloat(value, 2, 3, kFp6MaxMagnitudeCode, 5);
}
GNMR_HD_INLINE float decode_fp6_e3m2(uint8_t code) {
  return with_sign(minifloat_magnitude_value(code & 0x1Fu, 2, 3), (code >> 5) & 1u);
}

GNMR_HD_INLINE uint8_t encode_fp6_e2m3(float value) {
  return encode_saturating_minifloat(value, 3, 1, kFp6MaxMagnitudeCode, 5);
}
GNMR_HD_INLINE float decode_fp6_e2m3(uint8_t code) {
  return with_sign(minifloat_magnitude_value(code & 0x1Fu, 3, 1), (code >> 5) & 1u);
}

GNMR_HD_INLINE uint8_t encode_fp4_e2m1(float value) {
  return encode_saturating_minifloat(value, 1, 1, kFp4MaxMagnitudeCode, 3);
}
GNMR_HD_INLINE float decode_fp4_e2m1(uint8_t code) {
  return with_sign(minifloat_magnitude_value(code & 0x7u, 1, 1), (code >> 3) & 1u);
}

}  // namespace gnmr
