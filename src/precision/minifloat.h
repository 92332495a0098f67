// The shared core of the small floating-point formats (fp8 e4m3/e5m2, fp6 e3m2/e2m3,
// fp4 e2m1): rounding a float magnitude to a format with M mantissa bits and exponent
// bias B, and expanding a magnitude code back to a float. Each format's header (fp8.h,
// fp6_fp4.h) adds its own sign position, NaN/inf rules and saturation on top.
//
// A magnitude code is (exponent_field << M) | mantissa_field, the format's bits without the
// sign. Exponent field 0 holds the subnormals 0.m * 2^(1-B); field e > 0 holds 1.m * 2^(e-B)
// (OCP 8-bit Floating Point Specification v1.0 §4; OCP MX Specification v1.0 §5.3).
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

// Round |x| (given as the float's bits with the sign cleared; must not be NaN) to the nearest
// magnitude code, ties to even, subnormals included. The result is NOT clamped: a value past
// the format's largest finite code comes back as a larger code (infinity gives a huge one),
// and the caller saturates or maps it to inf. Rounding up out of the subnormal range or out
// of a binade carries into the exponent field, which is exactly the next representable value.
GNMR_HD_INLINE uint32_t round_magnitude_to_minifloat(uint32_t abs_bits, int mantissa_bits,
                                                     int exponent_bias) {
  const int exponent_field = static_cast<int>(abs_bits >> 23);
  // Float zero or subnormal (< 2^-126): below half of any target's smallest subnormal.
  if (exponent_field == 0) return 0;
  const int exponent = exponent_field - 127;
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;  // x = sig * 2^(exponent-23)
  const int min_normal_exponent = 1 - exponent_bias;
  int shift = 23 - mantissa_bits;  // drop this many significand bits
  if (exponent < min_normal_exponent) shift += min_normal_exponent - exponent;
  if (shift > 24) return 0;  // x < 2^-1 of the smallest subnormal: rounds to zero
  uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (dropped > half || (dropped == half && (kept & 1u))) ++kept;
  if (exponent < min_normal_exponent) return kept;  // subnormal: the code is the mantissa
  // kept holds the implicit leading one at bit M; adding (e + B - 1) << M places the biased
  // exponent, and a round-up to 2^(M+1) carries into the next exponent.
  return (static_cast<uint32_t>(exponent + exponent_bias - 1) << mantissa_bits) + kept;
}

// Expand a finite magnitude code to its float value (exact: every such value is a float).
GNMR_HD_INLINE float minifloat_magnitude_value(uint32_t magnitude, int mantissa_bits,
                                               int exponent_bias) {
  const uint32_t exponent_field = magnitude >> mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << mantissa_bits) - 1u);
  if (exponent_field == 0) {
    // Subnormal: mantissa * 2^(1 - B - M); the power of two is built exactly from its bits.
    const int scale_exponent = 1 - exponent_bias - mantissa_bits;
    const float unit = float_from_bits(static_cast<uint32_t>(scale_exponent + 127) << 23);
    return static_cast<float>(mantissa) * unit;
  }
  const uint32_t float_exponent =
      static_cast<uint32_t>(static_cast<int>(exponent_field) - exponent_bias + 127);
  return float_from_bits((float_exponent << 23) | (mantissa << (23 - mantissa_bits)));
}

// Apply a sign (0 or 1) to a non-negative float without arithmetic, so -0 comes out right.
GNMR_HD_INLINE float with_sign(float magnitude, uint32_t sign) {
  return float_from_bits(float_bits(magnitude) | (sign << 31));
}

}  // namespace gnmr
