// 8-bit floating point, OCP 8-bit Floating Point Specification (OFP8) v1.0:
//   E4M3 ("fn"): bias 7, no infinities, NaN = S.1111.111, max normal ±448 (S.1111.110).
//   E5M2: bias 15, IEEE-like: ±inf = S.11111.00, NaN = S.11111.{01,10,11}, max normal ±57344.
// Encoders round to nearest, ties to even (subnormals included) and keep the sign of zero.
#pragma once

#include <cstdint>

#include "precision/host_device.h"
#include "precision/minifloat.h"

namespace gnmr {

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kFp8E5m2Max = 57344.0f;
constexpr uint8_t kFp8E4m3MaxCode = 0x7E;  // magnitude bits of ±448
constexpr uint8_t kFp8E4m3NanCode = 0x7F;  // magnitude bits of the only NaN
constexpr uint8_t kFp8E5m2MaxCode = 0x7B;  // magnitude bits of ±57344
constexpr uint8_t kFp8E5m2InfCode = 0x7C;
constexpr uint8_t kFp8E5m2NanCode = 0x7F;  // the NaN the encoders produce

// float -> e4m3. Saturating ("satfinite", OFP8 §5.1 saturation mode, the only conversion
// the format allows since it has no inf): finite overflow and ±inf give ±448.
// NaN gives S.1111.111 with the input's sign.
GNMR_HD_INLINE uint8_t encode_fp8_e4m3(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return static_cast<uint8_t>(sign | kFp8E4m3NanCode);
  uint32_t magnitude = round_magnitude_to_minifloat(abs_bits, 3, 7);
  if (magnitude > kFp8E4m3MaxCode) magnitude = kFp8E4m3MaxCode;
  return static_cast<uint8_t>(sign | magnitude);
}

GNMR_HD_INLINE float decode_fp8_e4m3(uint8_t code) {
  const uint32_t sign = code >> 7;
  const uint32_t magnitude = code & 0x7Fu;
  if (magnitude == kFp8E4m3NanCode) return float_from_bits((sign << 31) | 0x7FC00000u);
  return with_sign(minifloat_magnitude_value(magnitude, 3, 7), sign);
}

// float -> e5m2, IEEE behaviour (OFP8 §5.1 non-saturating mode): results past the largest
// finite value after rounding become ±inf (so 61440, the midpoint to the next binade,
// ties to even = inf); ±inf stays ±inf; NaN gives S.11111.11.
GNMR_HD_INLINE uint8_t encode_fp8_e5m2(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return static_cast<uint8_t>(sign | kFp8E5m2NanCode);
  uint32_t magnitude = round_magnitude_to_minifloat(abs_bits, 2, 15);
  if (magnitude > kFp8E5m2InfCode) magnitude = kFp8E5m2InfCode;
  return static_cast<uint8_t>(sign | magnitude);
}

// float -> e5m2, saturating ("satfinite", as PTX cvt.satfinite and the quantizers use it):
// finite overflow and ±inf give ±57344; NaN gives S.11111.11.
GNMR_HD_INLINE uint8_t encode_fp8_e5m2_satfinite(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return static_cast<uint8_t>(sign | kFp8E5m2NanCode);
  uint32_t magnitude = round_magnitude_to_minifloat(abs_bits, 2, 15);
  if (magnitude > kFp8E5m2MaxCode) magnitude = kFp8E5m2MaxCode;
  return static_cast<uint8_t>(sign | magnitude);
}

GNMR_HD_INLINE float decode_fp8_e5m2(uint8_t code) {
  const uint32_t sign = code >> 7;
  const uint32_t magnitude = code & 0x7Fu;
  if (magnitude == kFp8E5m2InfCode) return float_from_bits((sign << 31) | 0x7F800000u);
  if (magnitude > kFp8E5m2InfCode) return float_from_bits((sign << 31) | 0x7FC00000u);
  return with_sign(minifloat_magnitude_value(magnitude, 2, 15), sign);
}

}  // namespace gnmr
