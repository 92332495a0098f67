// bf16 conversions (src/precision/bf16.h): every code decoded against the definition, and
// float -> bf16 on a sweep of float bit patterns against a reference that compares the
// input with its two bf16 neighbours in exact double arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "precision/bf16.h"
#include "precision/host_device.h"

namespace gnmr {
namespace {

// bf16 definition: 1 sign, 8 exponent (bias 127), 7 mantissa bits; exponent 255 is inf/NaN.
double bf16_definition_value(uint32_t code) {
  const int exponent = (code >> 7) & 0xFF;
  const int mantissa = code & 0x7F;
  const double sign = (code & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0xFF) {
    return mantissa == 0 ? sign * HUGE_VAL : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -126 - 7);
  return sign * std::ldexp(128 + mantissa, exponent - 127 - 7);
}

// Reference float -> bf16 for non-NaN x: the bf16 values just below and above |x| (the
// truncation and the next code; the code past the largest finite acts as 2^128 as IEEE-754
// §7.4 overflow specifies), compared with |x| exactly in double; ties go to the even code.
uint16_t reference_bf16(float x) {
  const uint32_t sign = float_bits(x) & 0x80000000u;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (std::isinf(x)) return static_cast<uint16_t>((sign >> 16) | 0x7F80);
  const uint32_t below_code = (float_bits(x) & 0x7FFFFFFFu) >> 16;
  const uint32_t above_code = below_code + 1;
  const double below = std::fabs(bf16_definition_value(below_code));
  const double above =
      above_code == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(bf16_definition_value(above_code));
  uint32_t pick;
  if (magnitude - below < above - magnitude) {
    pick = below_code;
  } else if (above - magnitude < magnitude - below) {
    pick = above_code;
  } else {
    pick = (below_code & 1u) == 0 ? below_code : above_code;
  }
  return static_cast<uint16_t>((sign >> 16) | pick);
}

TEST(Bf16, DecodesEveryCodeAsTheDefinitionSays) {
  for (uint32_t code = 0; code < 0x10000u; ++code) {
    const double expected = bf16_definition_value(code);
    const float decoded = decode_bf16(static_cast<uint16_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(decoded)) << code;
    } else {
      ASSERT_EQ(float_bits(decoded), float_bits(static_cast<float>(expected))) << code;
    }
  }
}

TEST(Bf16, EncodeOfDecodeGivesBackEveryNonNanCodeAndNanStaysQuietNan) {
  for (uint32_t code = 0; code < 0x10000u; ++code) {
    const float value = decode_bf16(static_cast<uint16_t>(code));
    const uint16_t again = encode_bf16(value);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(decode_bf16(again))) << code;
      ASSERT_EQ(again & 0x8000, code & 0x8000) << "NaN keeps its sign, code " << code;
      ASSERT_NE(again & 0x0040, 0) << "NaN comes out quiet, code " << code;
    } else {
      ASSERT_EQ(again, code);
    }
  }
}

TEST(Bf16, MidpointsBetweenEveryPairOfNeighboursRoundToEven) {
  for (uint32_t code = 0; code < 0x7F7F; ++code) {  // positive finite pairs (code, code + 1)
    const float mid = float_from_bits((code << 16) | 0x8000u);  // exactly halfway
    const uint32_t even = (code & 1u) == 0 ? code : code + 1;
    ASSERT_EQ(encode_bf16(mid), even) << code;
    ASSERT_EQ(encode_bf16(-mid), even | 0x8000u) << code;
    ASSERT_EQ(encode_bf16(std::nextafter(mid, 0.0f)), code) << code;
    ASSERT_EQ(encode_bf16(std::nextafter(mid, HUGE_VALF)), code + 1) << code;
  }
}

TEST(Bf16, OverflowRoundsToInfinityAndSpecialsSurvive) {
  EXPECT_EQ(encode_bf16(std::numeric_limits<float>::max()), 0x7F80);  // above the top midpoint
  EXPECT_EQ(encode_bf16(float_from_bits(0x7F7F7FFFu)), 0x7F7F);       // just below it
  EXPECT_EQ(encode_bf16(HUGE_VALF), 0x7F80);
  EXPECT_EQ(encode_bf16(-HUGE_VALF), 0xFF80);
  EXPECT_EQ(encode_bf16(0.0f), 0x0000);
  EXPECT_EQ(encode_bf16(-0.0f), 0x8000);
  EXPECT_EQ(encode_bf16(float_from_bits(0x00008000u)), 0x0000);  // subnormal tie to even (0)
  EXPECT_EQ(encode_bf16(float_from_bits(0x00018000u)), 0x0002);  // subnormal tie to even (2)
  EXPECT_EQ(encode_bf16(float_from_bits(0x7F800001u)), 0x7FC0);  // signalling NaN -> quiet NaN
  EXPECT_EQ(encode_bf16(float_from_bits(0xFFFFFFFFu)), 0xFFFF);  // NaN payload top bits kept
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256.0f), 1.0f);          // tie 1|1+2^-7 goes to even 1
}

TEST(Bf16, EncodesASweepOfFloatBitPatternsLikeTheReference) {
  int checked = 0;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4093) {
    const float x = float_from_bits(static_cast<uint32_t>(bits));
    if (std::isnan(x)) continue;
    ASSERT_EQ(encode_bf16(x), reference_bf16(x)) << "bits 0x" << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

}  // namespace
}  // namespace gnmr
