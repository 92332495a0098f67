// Group-wise integer quantization of activations (src/precision/quantize_groupwise.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "precision/fake_quantize_int.h"
#include "precision/int8_gemm_output.h"
#include "precision/quantize_groupwise.h"

namespace gnmr {
namespace {

// Rows of normal noise with a different magnitude per row, so groups get different scales.
std::vector<float> random_activations(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 7) - 3);
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = magnitude * normal(rng);
  }
  return x;
}

struct RoundTrip {
  std::vector<uint8_t> packed;
  std::vector<float> scales;
  std::vector<float> restored;
};

RoundTrip round_trip(const std::vector<float>& x, int64_t rows, int64_t cols,
                     const GroupwiseSpec& spec, RngKey key = RngKey{}) {
  RoundTrip out;
  out.packed.resize(packed_bytes(rows, cols, spec));
  out.scales.resize(scale_count(rows, cols, spec));
  out.restored.resize(x.size());
  quantize_int_groupwise(x.data(), rows, cols, spec, out.packed.data(), out.scales.data(), key);
  dequantize_int_groupwise(out.packed.data(), out.scales.data(), rows, cols, spec,
                           out.restored.data());
  return out;
}

const int kGroupSizes[] = {32, 128, kGroupRow, kGroupTensor};

// A code times an inf scale (a group holding inf) is NaN; the CUDA twins are held to these
// bits, and the GPU makes other NaN bits than x86, so each is the one canonical NaN.
TEST(QuantizeGroupwise, CodeTimesAnInfScaleIsTheCanonicalNan) {
  const uint32_t canonical = 0x7FC00000u;
  EXPECT_EQ(float_bits(fake_quantize_int_element(1.0f, INFINITY, 127)), canonical);
  EXPECT_EQ(float_bits(fake_quantize_int_element(-2.0f, INFINITY, 7)), canonical);
  EXPECT_EQ(float_bits(int8_gemm_output(0, INFINITY, 1.0f)), canonical);
  EXPECT_EQ(float_bits(int8_gemm_output(-5, -INFINITY, 0.0f)), canonical);
  const GroupwiseSpec spec{8, kGroupRow};
  const float x[3] = {1.0f, INFINITY, -2.0f};
  std::vector<uint8_t> packed(size_t(packed_row_bytes(3, 8)));
  float scale = 0.0f;
  quantize_int_groupwise(x, 1, 3, spec, packed.data(), &scale);
  EXPECT_EQ(float_bits(dequantize_int_groupwise_element(packed.data(), &scale, 0, 0, 3, spec)),
            canonical);
}

TEST(QuantizeGroupwise, NearestRoundingErrorIsAtMostHalfAScaleStep) {
  const int64_t rows = 9, cols = 256;
  const std::vector<float> x = random_activations(rows, cols, 1);
  for (int bits = 2; bits <= 8; ++bits) {
    for (int group : kGroupSizes) {
      const GroupwiseSpec spec{bits, group, false};
      const RoundTrip q = round_trip(x, rows, cols, spec);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float scale = q.scales[group_scale_index(r, c, cols, spec)];
          const float xi = x[r * cols + c];
          // Half a step, plus the two fp32 roundings (x / scale, code * scale): a few ulp of x.
          const float bound = 0.5f * scale + 4.0f * FLT_EPSILON * std::fabs(xi);
          ASSERT_LE(std::fabs(xi - q.restored[r * cols + c]), bound)
              << "bits " << bits << " group " << group << " at " << r << "," << c;
        }
      }
    }
  }
}

TEST(QuantizeGroupwise, ScalesAreAbsmaxOverQmaxAndCodesAreNearestEven) {
  const int64_t rows = 4, cols = 64;
  const std::vector<float> x = random_activations(rows, cols, 2);
  const GroupwiseSpec spec{4, 16, false};
  const RoundTrip q = round_trip(x, rows, cols, spec);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 16; ++g) {
      float absmax = 0.0f;
      for (int64_t c = g * 16; c < (g + 1) * 16; ++c)
        absmax = std::max(absmax, std::fabs(x[r * cols + c]));
      const float scale = absmax / 7.0f;
      ASSERT_EQ(q.scales[r * (cols / 16) + g], scale);
      for (int64_t c = g * 16; c < (g + 1) * 16; ++c) {
        const float expected =
            std::min(7.0f, std::max(-7.0f, std::nearbyint(x[r * cols + c] / scale)));
        ASSERT_EQ(packed_int_code(q.packed.data(), r, c, cols, 4), static_cast<int>(expected));
      }
    }
  }
}

TEST(QuantizeGroupwise, AllZeroGroupHasZeroScaleAndZeroCodes) {
  const int64_t rows = 2, cols = 8;
  std::vector<float> x(rows * cols, 0.0f);
  x[4] = -3.0f;  // second group of row 0 is non-zero
  const GroupwiseSpec spec{4, 4, false};
  const RoundTrip q = round_trip(x, rows, cols, spec);
  EXPECT_EQ(q.scales[0], 0.0f);
  EXPECT_EQ(q.scales[1], 3.0f / 7.0f);
  EXPECT_EQ(q.scales[2], 0.0f);
  EXPECT_EQ(q.packed[0], 0);
  EXPECT_EQ(q.packed[1], 0);
  EXPECT_EQ(packed_int_code(q.packed.data(), 0, 4, cols, 4), -7);
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(q.restored[i], x[i]);
}

TEST(QuantizeGroupwise, TensorGroupUsesOneScaleFromTheGlobalAbsmax) {
  const int64_t rows = 5, cols = 12;
  std::vector<float> x = random_activations(rows, cols, 3);
  x[3 * cols + 5] = -100.0f;
  const GroupwiseSpec spec{8, kGroupTensor, false};
  ASSERT_EQ(scale_count(rows, cols, spec), 1u);
  const RoundTrip q = round_trip(x, rows, cols, spec);
  EXPECT_EQ(q.scales[0], 100.0f / 127.0f);
  EXPECT_EQ(packed_int_code(q.packed.data(), 3, 5, cols, 8), -127);
}

TEST(QuantizeGroupwise, PackedStorageRoundTripsEveryCodeForEveryBitWidth) {
  // With +-qmax in every row and G = row, the scale is exactly 1 and x = code survives.
  for (int bits = 2; bits <= 8; ++bits) {
    const int qmax = int_qmax(bits);
    for (int64_t cols : {int64_t{7}, int64_t{13}, int64_t{64}}) {
      const int64_t rows = 3;
      std::vector<float> x(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          x[r * cols + c] = static_cast<float>((c + 3 * r) % (2 * qmax + 1) - qmax);
        }
        x[r * cols] = static_cast<float>(r % 2 ? -qmax : qmax);
      }
      const GroupwiseSpec spec{bits, kGroupRow, false};
      const RoundTrip q = round_trip(x, rows, cols, spec);
      for (float scale : q.scales) ASSERT_EQ(scale, 1.0f);
      ASSERT_EQ(q.restored, x) << bits << " bits, " << cols << " cols";
      const int64_t row_bytes = packed_row_bytes(cols, bits);
      if (bits == 4) {
        EXPECT_EQ(q.packed[row_bytes],
                  pack_int4(static_cast<int>(x[cols]), static_cast<int>(x[cols + 1])));
      }
      if (bits == 2) {
        EXPECT_EQ(q.packed[0], pack_int2(static_cast<int>(x[0]), static_cast<int>(x[1]),
                                         static_cast<int>(x[2]), static_cast<int>(x[3])));
      }
      if (bits == 8 || bits == 3) {
        EXPECT_EQ(q.packed[1], encode_int_field(static_cast<int>(x[1]), bits));
      }
    }
  }
}

// pack_int_codes_x4 (the CUDA kernel's four codes a lane) lays its codes out as the packed
// storage does: its 1, 2 or 4 bytes equal quantize_int_groupwise_byte's for those elements.
TEST(QuantizeGroupwise, FourCodesPackIntoTheBytesThePerByteQuantizerWrites) {
  for (int bits = 2; bits <= 8; ++bits) {
    const int qmax = int_qmax(bits);
    const int64_t cols = 16;
    std::vector<float> x(cols);
    for (int64_t c = 0; c < cols; ++c)
      x[c] = static_cast<float>((5 * c + 3) % (2 * qmax + 1) - qmax);
    x[0] = static_cast<float>(qmax);  // G = row: the scale is exactly 1 and each code is x
    const GroupwiseSpec spec{bits, kGroupRow, false};
    const RoundTrip q = round_trip(x, 1, cols, spec);
    ASSERT_EQ(q.scales[0], 1.0f);
    const int per_byte = int_codes_per_byte(bits);
    for (int64_t col = 0; col < cols; col += 4) {
      const int codes[4] = {static_cast<int>(x[col]), static_cast<int>(x[col + 1]),
                            static_cast<int>(x[col + 2]), static_cast<int>(x[col + 3])};
      const uint32_t word = pack_int_codes_x4(codes, bits);
      for (int b = 0; b < 4 / per_byte; ++b) {
        EXPECT_EQ((word >> (8 * b)) & 0xFFu, q.packed[size_t(col / per_byte + b)])
            << bits << " bits, col " << col << ", byte " << b;
      }
      if (per_byte > 1) {
        EXPECT_EQ(word >> (8 * (4 / per_byte)), 0u) << "bits past its bytes";
      }
    }
  }
}

TEST(QuantizeGroupwise, PackedSizesFollowTheStorageRule) {
  const int64_t rows = 64, cols = 4096;
  EXPECT_EQ(packed_bytes(rows, cols, {8, 128, false}), size_t(rows * cols));
  EXPECT_EQ(packed_bytes(rows, cols, {4, 128, false}), size_t(rows * cols / 2));
  EXPECT_EQ(packed_bytes(rows, cols, {2, 128, false}), size_t(rows * cols / 4));
  for (int bits : {3, 5, 6, 7})
    EXPECT_EQ(packed_bytes(rows, cols, {bits, 128, false}), size_t(rows * cols));
  EXPECT_EQ(packed_bytes(2, 5, {4, kGroupRow, false}), 6u);  // each row rounds up to 3 bytes
  EXPECT_EQ(packed_bytes(2, 5, {2, kGroupRow, false}), 4u);
  EXPECT_EQ(scale_count(rows, cols, {4, 128, false}), size_t(rows * 32));
  EXPECT_EQ(scale_count(rows, cols, {4, kGroupRow, false}), size_t(rows));
  EXPECT_EQ(scale_count(rows, cols, {4, kGroupTensor, false}), 1u);
}

TEST(QuantizeGroupwise, FourBitActivationAtGroup128CostsAtMostPointThreeOfBf16) {
  const int64_t rows = 256, cols = 4096;
  const GroupwiseSpec spec{4, 128, false};
  const double saved =
      packed_bytes(rows, cols, spec) + scale_count(rows, cols, spec) * sizeof(float);
  const double bf16 = 2.0 * rows * cols;
  EXPECT_LE(saved / bf16, 0.3);  // (0.5 + 4/128) / 2 = 0.266
  const std::vector<float> x = random_activations(rows, 256, 4);
  EXPECT_EQ(quantize_int_groupwise(x.data(), rows, 256, spec).bytes(),
            size_t(rows * 128 + rows * 2 * 4));
}

TEST(QuantizeGroupwise, StochasticRoundingErrorIsBelowOneScaleStep) {
  const int64_t rows = 6, cols = 256;
  const std::vector<float> x = random_activations(rows, cols, 5);
  for (int bits : {2, 4, 8}) {
    const GroupwiseSpec spec{bits, 64, true};
    const RoundTrip q = round_trip(x, rows, cols, spec, RngKey{9, 1, 2});
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float scale = q.scales[group_scale_index(i / cols, i % cols, cols, spec)];
      ASSERT_LE(std::fabs(x[i] - q.restored[i]), scale + 4.0f * FLT_EPSILON * std::fabs(x[i]));
    }
  }
}

TEST(QuantizeGroupwise, StochasticRoundingIsUnbiasedOverKeys) {
  const int64_t rows = 1, cols = 128;
  const std::vector<float> x = random_activations(rows, cols, 6);
  const GroupwiseSpec spec{4, kGroupRow, true};
  const int draws = 2000;
  std::vector<double> sum(cols, 0.0);
  float scale = 0.0f;
  for (int step = 0; step < draws; ++step) {
    const RoundTrip q =
        round_trip(x, rows, cols, spec, RngKey{123, static_cast<uint32_t>(step), 0});
    scale = q.scales[0];
    for (int64_t c = 0; c < cols; ++c) sum[c] += q.restored[c];
  }
  double total_bias = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    const double mean = sum[c] / draws;
    // One draw is floor or ceil of x/scale: variance <= scale^2 / 4, so the mean's standard
    // deviation is <= scale / (2 sqrt(draws)) = 0.011 scale; 5 of them bound one element
    // (false alarm ~1e-4 over 128 elements).
    EXPECT_NEAR(mean, x[c], 5.0 * scale / (2.0 * std::sqrt(draws))) << "element " << c;
    total_bias += (mean - x[c]) / scale;
  }
  // Nearest rounding would leave a systematic bias; the average over elements must vanish:
  // its deviation is <= 0.011 / sqrt(128) = 0.001 scale; allow 5 of them.
  EXPECT_NEAR(total_bias / cols, 0.0, 5 * 0.5 / std::sqrt(draws) / std::sqrt(cols));
}

TEST(QuantizeGroupwise, StochasticRoundingIsReproducibleAndKeyed) {
  const int64_t rows = 4, cols = 256;
  const std::vector<float> x = random_activations(rows, cols, 7);
  const GroupwiseSpec spec{4, 128, true};
  const RoundTrip a = round_trip(x, rows, cols, spec, RngKey{1, 10, 3});
  const RoundTrip b = round_trip(x, rows, cols, spec, RngKey{1, 10, 3});
  const RoundTrip next_step = round_trip(x, rows, cols, spec, RngKey{1, 11, 3});
  const RoundTrip other_unit = round_trip(x, rows, cols, spec, RngKey{1, 10, 4});
  const RoundTrip other_seed = round_trip(x, rows, cols, spec, RngKey{2, 10, 3});
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_NE(a.packed, next_step.packed);
  EXPECT_NE(a.packed, other_unit.packed);
  EXPECT_NE(a.packed, other_seed.packed);
  EXPECT_EQ(a.scales, next_step.scales);  // only the rounding is random
}

TEST(QuantizeGroupwise, InvalidSpecsAreConfigErrorsThatNameTheFix) {
  const std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> packed(256);
  std::vector<float> scales(256);
  for (const GroupwiseSpec& bad :
       {GroupwiseSpec{1, 128, false}, GroupwiseSpec{9, 128, false}, GroupwiseSpec{4, 100, false},
        GroupwiseSpec{4, 0, false}, GroupwiseSpec{4, -3, false}}) {
    try {
      quantize_int_groupwise(x.data(), 1, 256, bad, packed.data(), scales.data());
      ADD_FAILURE() << "accepted bits " << bad.bits << " group " << bad.group_size;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Config);
      EXPECT_NE(std::string(e.what()).find("use"), std::string::npos) << e.what();
    }
  }
  // A row the in-row index arithmetic cannot hold in 32 bits (group_scale_index) is refused
  // before anything is read (no data needed: the check comes first).
  try {
    validate_groupwise_spec(int64_t{INT32_MAX} + 1, GroupwiseSpec{4, kGroupRow, false});
    ADD_FAILURE() << "accepted a row of 2^31 elements";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("rows of 2147483648 elements (at most 2^31 - 1)"),
              std::string::npos)
        << e.what();
  }
  validate_groupwise_spec(INT32_MAX, GroupwiseSpec{4, kGroupRow, false});  // the largest accepted
  EXPECT_EQ(parse_group_size("row"), kGroupRow);
  EXPECT_EQ(parse_group_size("tensor"), kGroupTensor);
  EXPECT_EQ(parse_group_size("64"), 64);
  EXPECT_THROW(parse_group_size("64x"), Error);
  EXPECT_THROW(parse_group_size("-1"), Error);
}

}  // namespace
}  // namespace gnmr
