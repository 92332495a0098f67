// Exhaustive tests of fp8 e4m3/e5m2, fp6 e3m2/e2m3 and fp4 e2m1 (src/precision/fp8.h,
// fp6_fp4.h) against the independent table-driven reference in format_reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "precision/format_reference.h"
#include "precision/fp6_fp4.h"
#include "precision/fp8.h"
#include "precision/host_device.h"

namespace gnmr {
namespace {

using test::FormatDefinition;
using test::Overflow;

struct FormatUnderTest {
  const FormatDefinition* definition;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
  Overflow overflow;
  // What the encoder returns for NaN with sign bit s (s = 0 or 1).
  uint8_t nan_code_positive;
  uint8_t nan_code_negative;
};

const FormatUnderTest kFormats[] = {
    {&test::kE4m3Definition, encode_fp8_e4m3, decode_fp8_e4m3, Overflow::kSaturate, 0x7F, 0xFF},
    {&test::kE5m2Definition, encode_fp8_e5m2, decode_fp8_e5m2, Overflow::kToInfinity, 0x7F, 0xFF},
    {&test::kE5m2Definition, encode_fp8_e5m2_satfinite, decode_fp8_e5m2, Overflow::kSaturate, 0x7F,
     0xFF},
    // fp6/fp4 have no NaN: NaN saturates to max magnitude with the NaN's sign (fp6_fp4.h).
    {&test::kE3m2Definition, encode_fp6_e3m2, decode_fp6_e3m2, Overflow::kSaturate, 0x1F, 0x3F},
    {&test::kE2m3Definition, encode_fp6_e2m3, decode_fp6_e2m3, Overflow::kSaturate, 0x1F, 0x3F},
    {&test::kE2m1Definition, encode_fp4_e2m1, decode_fp4_e2m1, Overflow::kSaturate, 0x7, 0xF},
};

class MinifloatFormat : public ::testing::TestWithParam<FormatUnderTest> {};

TEST_P(MinifloatFormat, DecodesEveryCodeAsTheDefinitionSays) {
  const FormatUnderTest& f = GetParam();
  for (int code = 0; code < f.definition->code_count(); ++code) {
    const double expected = f.definition->value(code);
    const float decoded = f.decode(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(decoded)) << f.definition->name << " code " << code;
      continue;
    }
    // Exact: every value is a float; bit equality also checks the sign of zero.
    EXPECT_EQ(float_bits(decoded), float_bits(static_cast<float>(expected)))
        << f.definition->name << " code " << code << " expected " << expected;
  }
}

TEST_P(MinifloatFormat, EncodeOfDecodeGivesBackEveryNonNanCode) {
  const FormatUnderTest& f = GetParam();
  for (int code = 0; code < f.definition->code_count(); ++code) {
    if (f.definition->is_nan(code)) continue;
    if (f.definition->is_inf(code) && f.overflow == Overflow::kSaturate) continue;
    EXPECT_EQ(f.encode(f.decode(static_cast<uint8_t>(code))), code)
        << f.definition->name << " code " << code;
  }
}

TEST_P(MinifloatFormat, MidpointsRoundToTheEvenNeighbour) {
  const FormatUnderTest& f = GetParam();
  const test::MagnitudeTable table = test::finite_magnitudes(*f.definition);
  for (size_t i = 0; i + 1 < table.values.size(); ++i) {
    // Adjacent values have at most 4 significant bits, so the midpoint is exact in float.
    const float low = static_cast<float>(table.values[i]);
    const float high = static_cast<float>(table.values[i + 1]);
    const float mid = 0.5f * (low + high);
    ASSERT_EQ(static_cast<double>(mid), 0.5 * (table.values[i] + table.values[i + 1]));
    const uint32_t even = (table.codes[i] & 1u) == 0 ? table.codes[i] : table.codes[i + 1];
    for (float sign : {1.0f, -1.0f}) {
      const uint32_t sign_bit = sign < 0 ? f.definition->sign_bit() : 0;
      EXPECT_EQ(f.encode(sign * mid), sign_bit | even) << f.definition->name << " mid " << mid;
      EXPECT_EQ(f.encode(sign * std::nextafter(mid, 0.0f)), sign_bit | table.codes[i])
          << f.definition->name << " just below " << mid;
      EXPECT_EQ(f.encode(sign * std::nextafter(mid, 1e30f)), sign_bit | table.codes[i + 1])
          << f.definition->name << " just above " << mid;
    }
  }
}

TEST_P(MinifloatFormat, ValuesPastTheMaximumSaturateOrBecomeInfinity) {
  const FormatUnderTest& f = GetParam();
  const test::MagnitudeTable table = test::finite_magnitudes(*f.definition);
  const float max = static_cast<float>(table.values.back());
  const uint32_t max_code = table.codes.back();
  const uint32_t overflow_code = f.overflow == Overflow::kSaturate ? max_code : max_code + 1;
  const uint32_t s = f.definition->sign_bit();
  EXPECT_EQ(f.encode(max), max_code);
  EXPECT_EQ(f.encode(std::nextafter(max, 1e30f)), max_code);  // rounds back down to max
  EXPECT_EQ(f.encode(4.0f * max), overflow_code);
  EXPECT_EQ(f.encode(-4.0f * max), s | overflow_code);
  EXPECT_EQ(f.encode(std::numeric_limits<float>::max()), overflow_code);
  EXPECT_EQ(f.encode(HUGE_VALF), overflow_code);
  EXPECT_EQ(f.encode(-HUGE_VALF), s | overflow_code);
}

TEST_P(MinifloatFormat, SubnormalsAndUnderflowRoundToNearestEven) {
  const FormatUnderTest& f = GetParam();
  const double smallest = f.definition->value(1);  // code 1: the smallest subnormal
  ASSERT_GT(smallest, 0.0);
  const float tiny = static_cast<float>(smallest);
  EXPECT_EQ(f.encode(tiny), 1);
  EXPECT_EQ(f.encode(0.5f * tiny), 0);                           // tie with 0: even is 0
  EXPECT_EQ(f.encode(std::nextafter(0.5f * tiny, 1.0f)), 1);     // past the tie
  EXPECT_EQ(f.encode(1.5f * tiny), 2);                           // tie 1|2: even is 2
  EXPECT_EQ(f.encode(-0.25f * tiny), f.definition->sign_bit());  // underflow keeps sign
  EXPECT_EQ(f.encode(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(f.encode(-std::numeric_limits<float>::min()), f.definition->sign_bit());
}

TEST_P(MinifloatFormat, ZeroKeepsItsSignAndNanFollowsTheFormatRule) {
  const FormatUnderTest& f = GetParam();
  EXPECT_EQ(f.encode(0.0f), 0);
  EXPECT_EQ(f.encode(-0.0f), f.definition->sign_bit());
  EXPECT_TRUE(std::signbit(f.decode(static_cast<uint8_t>(f.definition->sign_bit()))));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f.encode(nan), f.nan_code_positive);
  EXPECT_EQ(f.encode(-nan), f.nan_code_negative);
  EXPECT_EQ(f.encode(float_from_bits(0x7F800001u)), f.nan_code_positive);  // signalling NaN
}

TEST_P(MinifloatFormat, EncodesASweepOfFloatBitPatternsLikeTheReference) {
  const FormatUnderTest& f = GetParam();
  const test::MagnitudeTable table = test::finite_magnitudes(*f.definition);
  std::vector<uint32_t> patterns;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4093) patterns.push_back(bits);
  // Denser where the formats live: |x| in [2^-20, 2^17), both signs.
  for (uint32_t bits = 0x35800000u; bits < 0x48000000u; bits += 257) {
    patterns.push_back(bits);
    patterns.push_back(bits | 0x80000000u);
  }
  for (uint32_t special : {0x00000000u, 0x80000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u,
                           0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x3F800000u, 0xBF800000u}) {
    patterns.push_back(special);
  }
  int mismatches = 0;
  for (uint32_t bits : patterns) {
    const float x = float_from_bits(bits);
    if (std::isnan(x)) continue;
    const uint32_t expected = test::reference_encode(*f.definition, table, x, f.overflow);
    const uint32_t actual = f.encode(x);
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << f.definition->name << " x=" << x << " bits=0x" << std::hex << bits
                    << " expected 0x" << expected << " got 0x" << actual;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

std::string format_name(const ::testing::TestParamInfo<FormatUnderTest>& info) {
  std::string name = info.param.definition->name;
  if (info.param.encode == encode_fp8_e5m2_satfinite) name += "_satfinite";
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, MinifloatFormat, ::testing::ValuesIn(kFormats), format_name);

TEST(MinifloatFormat, LargestValuesMatchTheSpecifications) {
  EXPECT_EQ(decode_fp8_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_fp8_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(decode_fp6_e3m2(0x1F), 28.0f);
  EXPECT_EQ(decode_fp6_e2m3(0x1F), 7.5f);
  EXPECT_EQ(decode_fp4_e2m1(0x7), 6.0f);
  EXPECT_EQ(decode_fp8_e4m3(0x01), std::ldexp(1.0f, -9));   // smallest subnormal 2^-9
  EXPECT_EQ(decode_fp8_e5m2(0x01), std::ldexp(1.0f, -16));  // smallest subnormal 2^-16
  EXPECT_EQ(encode_fp8_e5m2(61440.0f), 0x7C);  // midpoint 57344|65536 ties to even = inf
  EXPECT_EQ(encode_fp8_e5m2_satfinite(61440.0f), 0x7B);
  EXPECT_EQ(encode_fp8_e4m3(464.0f), 0x7E);  // midpoint 448|480 saturates
}

}  // namespace
}  // namespace gnmr
