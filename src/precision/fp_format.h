// FpFormat: the small floating-point formats the fine-grained quantizer (quantize_fine_grained.h)
// can target, with one dispatch point for their encoders, decoders and largest values.
// Storage: e4m3 and e5m2 keep their own codes; the 6- and 4-bit formats are stored as e4m3
// codes of the same value (every fp6/fp4 value is exactly representable in e4m3, so they
// run on FP8 tensor cores — docs/DESIGN.md §4).
#pragma once

#include <cstdint>
#include <string>

#include "precision/fp6_fp4.h"
#include "precision/fp8.h"
#include "precision/host_device.h"
#include "util/error.h"

namespace gnmr {

enum class FpFormat : int { kE4M3 = 0, kE5M2 = 1, kE3M2 = 2, kE2M3 = 3, kE2M1 = 4 };

GNMR_HD_INLINE float fp_format_max(FpFormat format) {
  switch (format) {
    case FpFormat::kE4M3:
      return kFp8E4m3Max;
    case FpFormat::kE5M2:
      return kFp8E5m2Max;
    case FpFormat::kE3M2:
      return kFp6E3m2Max;
    case FpFormat::kE2M3:
      return kFp6E2m3Max;
    case FpFormat::kE2M1:
      return kFp4E2m1Max;
  }
  return 0.0f;
}

// The value `value` takes after a saturating round-to-nearest-even into `format`.
GNMR_HD_INLINE float round_to_fp_format(FpFormat format, float value) {
  switch (format) {
    case FpFormat::kE4M3:
      return decode_fp8_e4m3(encode_fp8_e4m3(value));
    case FpFormat::kE5M2:
      return decode_fp8_e5m2(encode_fp8_e5m2_satfinite(value));
    case FpFormat::kE3M2:
      return decode_fp6_e3m2(encode_fp6_e3m2(value));
    case FpFormat::kE2M3:
      return decode_fp6_e2m3(encode_fp6_e2m3(value));
    case FpFormat::kE2M1:
      return decode_fp4_e2m1(encode_fp4_e2m1(value));
  }
  return value;
}

// Storage code for `value` in `format`: an e5m2 code for kE5M2, an e4m3 code otherwise
// (for fp6/fp4 the e4m3 code of the fp6/fp4-rounded value; the re-encoding is exact).
GNMR_HD_INLINE uint8_t encode_fp_storage(FpFormat format, float value) {
  switch (format) {
    case FpFormat::kE4M3:
      return encode_fp8_e4m3(value);
    case FpFormat::kE5M2:
      return encode_fp8_e5m2_satfinite(value);
    default:
      return encode_fp8_e4m3(round_to_fp_format(format, value));
  }
}

GNMR_HD_INLINE float decode_fp_storage(FpFormat format, uint8_t code) {
  return format == FpFormat::kE5M2 ? decode_fp8_e5m2(code) : decode_fp8_e4m3(code);
}

// Bits of a code in `format` (sign, exponent, mantissa): 8, 8, 6, 6, 4.
inline int fp_format_bits(FpFormat format) {
  switch (format) {
    case FpFormat::kE4M3:
    case FpFormat::kE5M2:
      return 8;
    case FpFormat::kE3M2:
    case FpFormat::kE2M3:
      return 6;
    case FpFormat::kE2M1:
      return 4;
  }
  return 0;
}

// Config spelling: "e4m3", "e5m2", "e3m2", "e2m3", "e2m1".
inline const char* fp_format_name(FpFormat format) {
  switch (format) {
    case FpFormat::kE4M3:
      return "e4m3";
    case FpFormat::kE5M2:
      return "e5m2";
    case FpFormat::kE3M2:
      return "e3m2";
    case FpFormat::kE2M3:
      return "e2m3";
    case FpFormat::kE2M1:
      return "e2m1";
  }
  return "?";
}

inline FpFormat parse_fp_format(const std::string& name) {
  for (FpFormat format :
       {FpFormat::kE4M3, FpFormat::kE5M2, FpFormat::kE3M2, FpFormat::kE2M3, FpFormat::kE2M1}) {
    if (name == fp_format_name(format)) return format;
  }
  throw Error(ErrorKind::Config, "precision: unknown floating-point format \"" + name +
                                     "\" (use one of e4m3, e5m2, e3m2, e2m3, e2m1)");
}

}  // namespace gnmr
