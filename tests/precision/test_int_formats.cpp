// Symmetric integer helpers and packing (src/precision/int_formats.h) and the counter-based
// RNG (src/precision/counter_rng.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>

#include "precision/counter_rng.h"
#include "precision/int_formats.h"

namespace gnmr {
namespace {

TEST(IntFormats, SymmetricRangeExcludesTheMostNegativeCode) {
  for (int bits = 2; bits <= 8; ++bits) {
    const int qmax = (1 << (bits - 1)) - 1;
    EXPECT_EQ(int_qmax(bits), qmax);
    EXPECT_EQ(clamp_symmetric_int(1000, bits), qmax);
    EXPECT_EQ(clamp_symmetric_int(-1000, bits), -qmax);
    EXPECT_EQ(clamp_symmetric_int(-(1 << (bits - 1)), bits), -qmax);
    for (int v = -qmax; v <= qmax; ++v) {
      EXPECT_EQ(clamp_symmetric_int(v, bits), v);
      const uint8_t field = encode_int_field(v, bits);
      EXPECT_LT(field, 1 << bits);
      EXPECT_EQ(decode_int_field(field, bits), v) << bits << " bits, value " << v;
    }
  }
}

TEST(IntFormats, Int4PacksTwoPerByteLowNibbleFirst) {
  EXPECT_EQ(pack_int4(1, 2), 0x21);
  EXPECT_EQ(pack_int4(-1, 7), 0x7F);
  EXPECT_EQ(pack_int4(-7, 0), 0x09);
  for (int low = -7; low <= 7; ++low) {
    for (int high = -7; high <= 7; ++high) {
      const uint8_t byte = pack_int4(low, high);
      EXPECT_EQ(unpack_int4_low(byte), low);
      EXPECT_EQ(unpack_int4_high(byte), high);
    }
  }
}

TEST(IntFormats, Int2PacksFourPerByteFirstElementInTheLowBits) {
  EXPECT_EQ(pack_int2(1, 0, -1, 1), 0x01 | (0x3 << 4) | (0x1 << 6));
  for (int a = -1; a <= 1; ++a)
    for (int b = -1; b <= 1; ++b)
      for (int c = -1; c <= 1; ++c)
        for (int d = -1; d <= 1; ++d) {
          const uint8_t byte = pack_int2(a, b, c, d);
          EXPECT_EQ(unpack_int2(byte, 0), a);
          EXPECT_EQ(unpack_int2(byte, 1), b);
          EXPECT_EQ(unpack_int2(byte, 2), c);
          EXPECT_EQ(unpack_int2(byte, 3), d);
        }
}

TEST(IntFormats, CodesPerByteFollowTheStorageRule) {
  EXPECT_EQ(int_codes_per_byte(2), 4);
  EXPECT_EQ(int_codes_per_byte(4), 2);
  for (int bits : {3, 5, 6, 7, 8}) EXPECT_EQ(int_codes_per_byte(bits), 1);
}

TEST(IntFormats, NearestQuantizationRoundsTiesToEvenAndSaturates) {
  EXPECT_EQ(quantize_int_nearest(2.5f, 1.0f, 7), 2);
  EXPECT_EQ(quantize_int_nearest(3.5f, 1.0f, 7), 4);
  EXPECT_EQ(quantize_int_nearest(-2.5f, 1.0f, 7), -2);
  EXPECT_EQ(quantize_int_nearest(100.0f, 1.0f, 7), 7);
  EXPECT_EQ(quantize_int_nearest(-100.0f, 1.0f, 7), -7);
  EXPECT_EQ(quantize_int_nearest(5.0f, 0.0f, 7), 0);  // all-zero group
  EXPECT_EQ(quantize_int_nearest(NAN, 1.0f, 7), 0);
  EXPECT_EQ(quantize_int_nearest(INFINITY, 1.0f, 127), 127);
  EXPECT_EQ(encode_int8_symmetric(-200.0f), -127);
  EXPECT_EQ(encode_int8_symmetric(12.5f), 12);
}

TEST(IntFormats, StochasticQuantizationPicksTheNeighbourByTheUniform) {
  // v = 2.25: rounds up exactly when uniform < 0.25.
  EXPECT_EQ(quantize_int_stochastic(2.25f, 1.0f, 7, 0.0f), 3);
  EXPECT_EQ(quantize_int_stochastic(2.25f, 1.0f, 7, 0.2499f), 3);
  EXPECT_EQ(quantize_int_stochastic(2.25f, 1.0f, 7, 0.25f), 2);
  EXPECT_EQ(quantize_int_stochastic(-2.25f, 1.0f, 7, 0.7f), -2);  // floor -3, fraction 0.75
  EXPECT_EQ(quantize_int_stochastic(-2.25f, 1.0f, 7, 0.8f), -3);
  EXPECT_EQ(quantize_int_stochastic(3.0f, 1.0f, 7, 0.999f), 3);  // integers stay put
  EXPECT_EQ(quantize_int_stochastic(9.0f, 1.0f, 7, 0.0f), 7);
  EXPECT_EQ(quantize_int_stochastic(-9.0f, 1.0f, 7, 0.0f), -7);
}

// Known-answer vectors of Philox-4x32-10 from the Random123 distribution (kat_vectors).
TEST(CounterRng, Philox4x32x10MatchesTheRandom123KnownAnswers) {
  Philox4x32 out = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(out.v[0], 0x6627e8d5u);
  EXPECT_EQ(out.v[1], 0xe169c58du);
  EXPECT_EQ(out.v[2], 0xbc57ac4cu);
  EXPECT_EQ(out.v[3], 0x9b00dbd8u);
  out = philox4x32_10(Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                      0xffffffffu);
  EXPECT_EQ(out.v[0], 0x408f276du);
  EXPECT_EQ(out.v[1], 0x41c83b0eu);
  EXPECT_EQ(out.v[2], 0xa20bc7c6u);
  EXPECT_EQ(out.v[3], 0x6d5451fdu);
  out = philox4x32_10(Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                      0x299f31d0u);
  EXPECT_EQ(out.v[0], 0xd16cfe09u);
  EXPECT_EQ(out.v[1], 0x94fdccebu);
  EXPECT_EQ(out.v[2], 0x5001e420u);
  EXPECT_EQ(out.v[3], 0x24126ea1u);
}

TEST(CounterRng, StreamsDependOnEveryKeyFieldAndTheIndex) {
  const RngKey base{42, 7, 3};
  const uint32_t x = counter_rng_bits(base, 1000);
  EXPECT_EQ(counter_rng_bits(base, 1000), x);  // a pure function
  EXPECT_NE(counter_rng_bits(RngKey{43, 7, 3}, 1000), x);
  EXPECT_NE(counter_rng_bits(RngKey{42, 8, 3}, 1000), x);
  EXPECT_NE(counter_rng_bits(RngKey{42, 7, 4}, 1000), x);
  EXPECT_NE(counter_rng_bits(RngKey{42ull | (1ull << 40), 7, 3}, 1000), x);
  std::set<uint32_t> seen;
  for (uint64_t i = 0; i < 4096; ++i) seen.insert(counter_rng_bits(base, i));
  EXPECT_GT(seen.size(), 4090u);  // 4096 draws of 32 bits: collisions are ~0.002 expected
}

TEST(CounterRng, UniformsLieInTheUnitIntervalWithMeanOneHalf) {
  const RngKey key{1, 2, 3};
  const int n = 100000;
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const float u = counter_rng_uniform(key, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // Standard deviation of the mean: sqrt(1/12 / n) = 0.00091; allow 5 of them.
  EXPECT_NEAR(sum / n, 0.5, 5 * 0.00091);
}

}  // namespace
}  // namespace gnmr
