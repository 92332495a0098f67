// bfloat16: 1 sign, 8 exponent, 7 mantissa bits — the upper half of an IEEE-754 binary32.
// Conversions by bit manipulation so host and device agree bit for bit.
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

// float -> bf16, round to nearest, ties to even (IEEE-754 §4.3.1). Overflow rounds to ±inf
// as IEEE requires; NaN stays NaN with its sign and payload top bits, forced quiet
// (mantissa bit 6 set) so truncation can never turn it into an infinity.
GNMR_HD_INLINE uint16_t encode_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t lsb = (bits >> 16) & 1u;  // ties go to the even result
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

// bf16 -> float is exact: the bf16 bits are the float's upper half.
GNMR_HD_INLINE float decode_bf16(uint16_t code) {
  return float_from_bits(static_cast<uint32_t>(code) << 16);
}

// Emulate a bf16 store and load: the nearest bf16 value, as a float.
GNMR_HD_INLINE float round_to_bf16(float value) {
  return decode_bf16(encode_bf16(value));
}

}  // namespace gnmr
