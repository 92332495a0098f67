// Fine-grained (DeepSeek-V3 style) fp quantization (src/precision/quantize_fine_grained.h,
// fp_format.h).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "precision/quantize_fine_grained.h"

namespace gnmr {
namespace {

const FpFormat kAllFormats[] = {FpFormat::kE4M3, FpFormat::kE5M2, FpFormat::kE3M2, FpFormat::kE2M3,
                                FpFormat::kE2M1};

struct FormatShape {
  int mantissa_bits;
  float smallest_subnormal;
};

// From the OFP8 / OCP MX definitions: 2^(1 - bias - M) is the smallest subnormal.
FormatShape shape_of(FpFormat format) {
  switch (format) {
    case FpFormat::kE4M3:
      return {3, std::ldexp(1.0f, -9)};
    case FpFormat::kE5M2:
      return {2, std::ldexp(1.0f, -16)};
    case FpFormat::kE3M2:
      return {2, std::ldexp(1.0f, -4)};
    case FpFormat::kE2M3:
      return {3, std::ldexp(1.0f, -3)};
    case FpFormat::kE2M1:
      return {1, std::ldexp(1.0f, -1)};
  }
  return {0, 0.0f};
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = normal(rng);
  for (int64_t i = 0; i < rows * cols; i += 97) x[i] *= 50.0f;  // outliers, as activations have
  return x;
}

TEST(FineGrainedFormats, EverySixAndFourBitValueIsExactlyAnE4m3Value) {
  for (int code = 0; code < 64; ++code) {
    for (float value : {decode_fp6_e3m2(code), decode_fp6_e2m3(code)}) {
      EXPECT_EQ(decode_fp8_e4m3(encode_fp8_e4m3(value)), value) << "fp6 code " << code;
    }
  }
  for (int code = 0; code < 16; ++code) {
    const float value = decode_fp4_e2m1(code);
    EXPECT_EQ(decode_fp8_e4m3(encode_fp8_e4m3(value)), value) << "fp4 code " << code;
  }
}

TEST(FineGrainedFormats, StorageCodesDecodeToTheFormatRoundedValue) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-500.0f, 500.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = uniform(rng) * std::ldexp(1.0f, -(i % 12));
    EXPECT_EQ(decode_fp_storage(FpFormat::kE3M2, encode_fp_storage(FpFormat::kE3M2, x)),
              decode_fp6_e3m2(encode_fp6_e3m2(x)));
    EXPECT_EQ(decode_fp_storage(FpFormat::kE2M3, encode_fp_storage(FpFormat::kE2M3, x)),
              decode_fp6_e2m3(encode_fp6_e2m3(x)));
    EXPECT_EQ(decode_fp_storage(FpFormat::kE2M1, encode_fp_storage(FpFormat::kE2M1, x)),
              decode_fp4_e2m1(encode_fp4_e2m1(x)));
    EXPECT_EQ(encode_fp_storage(FpFormat::kE4M3, x), encode_fp8_e4m3(x));
    EXPECT_EQ(encode_fp_storage(FpFormat::kE5M2, x), encode_fp8_e5m2_satfinite(x));
  }
}

TEST(FineGrainedFormats, NamesParseAndUnknownNamesAreConfigErrors) {
  for (FpFormat format : kAllFormats) EXPECT_EQ(parse_fp_format(fp_format_name(format)), format);
  try {
    parse_fp_format("fp6");
    ADD_FAILURE() << "accepted fp6";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("e3m2"), std::string::npos);
  }
}

TEST(QuantizeFineGrained, TileScaleMapsTheTileAbsmaxExactlyToTheFormatMax) {
  const int64_t rows = 4, cols = 384;
  const std::vector<float> x = random_matrix(rows, cols, 1);
  for (FpFormat format : kAllFormats) {
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> scales(rows * 3);
    quantize_fp_tile_1x128(x.data(), rows, cols, format, codes.data(), scales.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < 3; ++t) {
        int64_t at = r * cols + t * 128;
        for (int64_t c = t * 128; c < (t + 1) * 128; ++c) {
          if (std::fabs(x[r * cols + c]) > std::fabs(x[at])) at = r * cols + c;
        }
        const float scale = scales[r * 3 + t];
        EXPECT_EQ(scale, std::fabs(x[at]) / fp_format_max(format));
        EXPECT_EQ(std::fabs(decode_fp_storage(format, codes[at])), fp_format_max(format))
            << fp_format_name(format) << " row " << r << " tile " << t;
      }
    }
  }
}

TEST(QuantizeFineGrained, ErrorIsWithinHalfAnUlpOfTheFormat) {
  const int64_t rows = 8, cols = 256;
  const std::vector<float> x = random_matrix(rows, cols, 2);
  for (FpFormat format : kAllFormats) {
    const FormatShape shape = shape_of(format);
    std::vector<float> restored(rows * cols);
    fake_quantize_fp_tile_1x128(x.data(), rows, cols, format, restored.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < 2; ++t) {
        float absmax = 0.0f;
        for (int64_t c = t * 128; c < (t + 1) * 128; ++c)
          absmax = std::fmax(absmax, std::fabs(x[r * cols + c]));
        const float scale = absmax / fp_format_max(format);
        for (int64_t c = t * 128; c < (t + 1) * 128; ++c) {
          const float xi = x[r * cols + c];
          // Normal range: relative error <= 2^-(M+1); subnormal range: absolute error <= half
          // the smallest subnormal (times the scale); plus a few fp32 ulp for x / s and q * s.
          const float bound = std::fmax(std::ldexp(std::fabs(xi), -(shape.mantissa_bits + 1)),
                                        0.5f * shape.smallest_subnormal * scale) +
                              4.0f * FLT_EPSILON * std::fabs(xi);
          ASSERT_LE(std::fabs(xi - restored[r * cols + c]), bound)
              << fp_format_name(format) << " x=" << xi;
        }
      }
    }
  }
}

TEST(QuantizeFineGrained, FakeQuantizeEqualsDequantizeOfQuantizeAndWorksInPlace) {
  const int64_t rows = 130, cols = 200;
  const std::vector<float> x = random_matrix(rows, cols, 3);
  for (FpFormat format : kAllFormats) {
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> scales(fp_blockwise_scale_count(rows, cols, 128, 128));
    std::vector<float> restored(rows * cols);
    quantize_fp_block_128x128(x.data(), rows, cols, format, codes.data(), scales.data());
    dequantize_fp_block_128x128(codes.data(), scales.data(), rows, cols, format, restored.data());
    std::vector<float> in_place = x;
    fake_quantize_fp_block_128x128(in_place.data(), rows, cols, format, in_place.data());
    EXPECT_EQ(in_place, restored) << fp_format_name(format);

    std::vector<float> tile_codes_restored(rows * cols), tile_fake(rows * cols);
    std::vector<float> tile_scales(fp_blockwise_scale_count(rows, cols, 1, 128));
    quantize_fp_tile_1x128(x.data(), rows, cols, format, codes.data(), tile_scales.data());
    dequantize_fp_tile_1x128(codes.data(), tile_scales.data(), rows, cols, format,
                             tile_codes_restored.data());
    fake_quantize_fp_tile_1x128(x.data(), rows, cols, format, tile_fake.data());
    EXPECT_EQ(tile_fake, tile_codes_restored) << fp_format_name(format);
  }
}

// Counts the float bit patterns (a stride through all 2^32, so every exponent, both signs,
// zeros, subnormals, infinities and NaNs) on which the fast fake quantizer differs from the
// storage-code reference, at several scales.
template <FpFormat kFormat>
int64_t fast_fake_quantize_mismatches() {
  int64_t mismatches = 0;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 4093) {
    const float x = float_from_bits(static_cast<uint32_t>(bits));
    for (float scale : {1.0f, 0.37f, 3.0e-5f, 0.0f}) {
      const float fast = fake_quantize_fp_element_fast<kFormat>(x, scale);
      const float reference = fake_quantize_fp_element(x, scale, kFormat);
      if (float_bits(fast) != float_bits(reference)) ++mismatches;
    }
  }
  return mismatches;
}

TEST(QuantizeFineGrained, FastElementFakeQuantizerMatchesTheStorageCodecs) {
  EXPECT_EQ(fast_fake_quantize_mismatches<FpFormat::kE4M3>(), 0);
  EXPECT_EQ(fast_fake_quantize_mismatches<FpFormat::kE5M2>(), 0);
  EXPECT_EQ(fast_fake_quantize_mismatches<FpFormat::kE3M2>(), 0);
  EXPECT_EQ(fast_fake_quantize_mismatches<FpFormat::kE2M3>(), 0);
  EXPECT_EQ(fast_fake_quantize_mismatches<FpFormat::kE2M1>(), 0);
  // Ties between two codes go to the even one: 2.5 lies between e2m1's 2 and 3, 5 between 4
  // and 6, 0.25 between 0 and the subnormal 0.5.
  EXPECT_EQ(fake_quantize_fp_element_fast<FpFormat::kE2M1>(2.5f, 1.0f), 2.0f);
  EXPECT_EQ(fake_quantize_fp_element_fast<FpFormat::kE2M1>(-5.0f, 1.0f), -4.0f);
  EXPECT_EQ(float_bits(fake_quantize_fp_element_fast<FpFormat::kE2M1>(-0.25f, 1.0f)),
            float_bits(-0.0f));
  EXPECT_EQ(fake_quantize_fp_element_fast<FpFormat::kE2M1>(0.75f, 1.0f), 1.0f);
}

// The GPU makes other NaN bits than x86 for the same arithmetic (host_device.h), and the CUDA
// twins are held to these functions' bits: every NaN they return is the one canonical NaN,
// whatever made it (0 times a tile's inf scale; a NaN input in e4m3 and e5m2). A NaN's sign and
// payload change nothing: the fp6 and fp4 formats, which have no NaN, saturate every NaN (and
// inf / an inf scale) to +max, whatever sign x86 or the GPU gave it.
template <FpFormat kFormat>
void expect_canonical_nans() {
  const uint32_t canonical = 0x7FC00000u;
  const bool has_nan = kFormat == FpFormat::kE4M3 || kFormat == FpFormat::kE5M2;
  const float positive_max = fake_quantize_fp_element_fast<kFormat>(1e30f, 0.5f);
  for (uint32_t nan_bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA5A5A5u}) {
    const float nan = float_from_bits(nan_bits);
    const float fast = fake_quantize_fp_element_fast<kFormat>(nan, 0.5f);
    EXPECT_EQ(float_bits(fast), float_bits(fake_quantize_fp_element(nan, 0.5f, kFormat)));
    EXPECT_EQ(float_bits(fast), has_nan ? canonical : float_bits(positive_max)) << nan_bits;
    EXPECT_EQ(quantize_fp_element(nan, 0.5f, kFormat), quantize_fp_element(NAN, 0.5f, kFormat));
  }
  for (float x : {1.0f, -3.0f, 0.0f, INFINITY, -INFINITY}) {
    // inf / inf is NaN: e4m3 and e5m2 keep it; the others saturate it to +max, times inf.
    const uint32_t expected = std::isinf(x) && !has_nan ? float_bits(INFINITY) : canonical;
    EXPECT_EQ(float_bits(fake_quantize_fp_element_fast<kFormat>(x, INFINITY)), expected) << x;
    EXPECT_EQ(float_bits(fake_quantize_fp_element(x, INFINITY, kFormat)), expected) << x;
  }
}

TEST(QuantizeFineGrained, EveryNanResultIsTheCanonicalNan) {
  for (FpFormat format : kAllFormats) {
    dispatch_fp_format(format, [](auto f) { expect_canonical_nans<decltype(f)::value>(); });
  }
  EXPECT_EQ(float_bits(canonical_nan(-0.0f)), float_bits(-0.0f));
  EXPECT_EQ(float_bits(canonical_nan(-INFINITY)), float_bits(-INFINITY));
}

// The float bit patterns (every `stride`-th, from `first`) on which the compile-time storage
// encoder the GPU's quantizers run differs from the codecs.
template <FpFormat kFormat>
int64_t fast_storage_code_mismatches(uint64_t first, uint64_t stride) {
  int64_t mismatches = 0;
  for (uint64_t bits = first; bits < (uint64_t(1) << 32); bits += stride) {
    const float v = float_from_bits(static_cast<uint32_t>(bits));
    if (encode_fp_storage_fast<kFormat>(v) != encode_fp_storage(kFormat, v)) ++mismatches;
  }
  return mismatches;
}

// Every 61st float (every exponent and sign, zeros, subnormals, infinities, NaNs), and every
// float of the binades where the formats' codes lie (2^-24 to 2^16: each format's rounding
// boundaries, subnormal steps and saturation). GNMR_EXHAUSTIVE_FLOATS=1 checks all 2^32 (about
// a minute per format).
template <FpFormat kFormat>
void expect_fast_storage_encoder_exact() {
  const bool all = std::getenv("GNMR_EXHAUSTIVE_FLOATS") != nullptr;
  EXPECT_EQ(fast_storage_code_mismatches<kFormat>(0, all ? 1 : 61), 0) << fp_format_name(kFormat);
  if (all) return;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t bits = 0x33800000u; bits < 0x47800000u; bits += 7) {  // 2^-24 .. 2^16
      const float v = float_from_bits(sign | bits);
      ASSERT_EQ(encode_fp_storage_fast<kFormat>(v), encode_fp_storage(kFormat, v))
          << fp_format_name(kFormat) << " " << v;
    }
  }
  // The quantizer around it: the same codes for x / scale, scale 0 included.
  for (float scale : {1.0f, 0.37f, 3.0e-5f, 0.0f, INFINITY}) {
    for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 65537) {
      const float x = float_from_bits(static_cast<uint32_t>(bits));
      ASSERT_EQ(quantize_fp_element_fast<kFormat>(x, scale), quantize_fp_element(x, scale, kFormat))
          << fp_format_name(kFormat) << " x " << x << " scale " << scale;
    }
  }
}

TEST(QuantizeFineGrained, FastStorageEncoderGivesTheCodecsCodes) {
  for (FpFormat format : kAllFormats) {
    dispatch_fp_format(format,
                       [](auto f) { expect_fast_storage_encoder_exact<decltype(f)::value>(); });
  }
}

// Floats a stride over the bit patterns may step over: signed zeros, the smallest subnormals,
// the largest finite values, infinities, NaNs of both signs.
const float kSpecialFloats[] = {0.0f,     -0.0f,    0x1p-149f, -0x1p-149f, FLT_MAX,
                                -FLT_MAX, INFINITY, -INFINITY, NAN,        -NAN};

// The scales the reciprocal quotient is checked at: ones a 1x128 tile of activations or
// gradients gets, both ends of the range it takes (2^-80, 2^125), significands of all ones
// and of one ulp past 1 (where RN(1 / s) is furthest from 1 / s), and 64 log-uniform ones.
std::vector<float> reciprocal_test_scales() {
  std::vector<float> scales = {
      1.0f,           0.37f,         3.0e-5f,         1.7f / 448.0f,  0x1p-80f,     0x1p125f,
      0x1.fffffep-1f, 0x1.000002p0f, 0x1.fffffep-70f, 0x1.000002p90f, 0x1.5555p-20f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> log2_scale(-80.0f, 125.0f);
  for (int i = 0; i < 64; ++i) scales.push_back(std::exp2(log2_scale(rng)));
  return scales;
}

// quotient_by_reciprocal against the IEEE division: every 61st float x at the first scales
// (every x with GNMR_EXHAUSTIVE_FLOATS=1), every 4099th at the random ones; the same bits for
// a normal quotient, a NaN only for a NaN. Then the codes quantize_fp_tile_elements gives, against
// quantize_fp_element, for every format, scales without a reciprocal (0, inf, NaN, below 2^-80,
// past 2^125) included.
TEST(QuantizeFineGrained, QuotientByReciprocalIsTheDivision) {
  const bool all = std::getenv("GNMR_EXHAUSTIVE_FLOATS") != nullptr;
  const std::vector<float> scales = reciprocal_test_scales();
  for (size_t i = 0; i < scales.size(); ++i) {
    const TileDivisor d = tile_divisor(scales[i]);
    ASSERT_NE(d.reciprocal, 0.0f) << scales[i];
    const uint64_t stride = i < 11 ? (all ? 1 : 61) : 4099;
    int64_t mismatches = 0;
    float first_x = 0.0f;
    auto check = [&](float x) {
      const float by_reciprocal = quotient_by_reciprocal(x, d), divided = x / scales[i];
      // Below 2^-100 the remainder is not exact; at these scales (2^-80 and up) the quotient
      // is then below 2^-20, which every format codes as a signed zero: the codes are checked
      // below. Within an ulp of overflow x * r may round to inf where x / s does not.
      const bool same =
          std::isnan(divided)        ? std::isnan(by_reciprocal)
          : std::fabs(x) < 0x1p-100f ? true
          : std::fabs(divided) > 0x1p127f
              ? by_reciprocal == divided || (std::isinf(by_reciprocal) &&
                                             std::signbit(by_reciprocal) == std::signbit(divided))
              : float_bits(by_reciprocal) == float_bits(divided);
      if (!same && mismatches++ == 0) first_x = x;
    };
    for (float x : kSpecialFloats) check(x);
    for (uint64_t bits = i; bits < (uint64_t(1) << 32); bits += stride) {
      check(float_from_bits(static_cast<uint32_t>(bits)));
    }
    EXPECT_EQ(mismatches, 0) << "scale " << scales[i] << ", first x " << first_x;
  }
  std::vector<float> code_scales = scales;
  for (float s : {0.0f, INFINITY, NAN, 0x1p-81f, 0x1p-127f, 0x1p-149f, 0x1p126f, FLT_MAX}) {
    code_scales.push_back(s);
  }
  for (FpFormat format : kAllFormats) {
    dispatch_fp_format(format, [&](auto f) {
      constexpr FpFormat kFormat = decltype(f)::value;
      for (float s : code_scales) {
        auto check = [&](float value) {
          const float x[1] = {value};
          uint8_t code[1];
          quantize_fp_tile_elements<kFormat>(x, tile_divisor(s), code);
          ASSERT_EQ(code[0], quantize_fp_element(x[0], s, kFormat))
              << fp_format_name(kFormat) << " x " << x[0] << " scale " << s;
        };
        for (float x : kSpecialFloats) check(x);
        for (uint64_t bits = 7; bits < (uint64_t(1) << 32); bits += 65521) {
          check(float_from_bits(static_cast<uint32_t>(bits)));
        }
      }
    });
  }
}

TEST(QuantizeFineGrained, FakeQuantizeEqualsDequantizeOfQuantizeForEveryBlockShape) {
  // The fake quantizer walks rows band by band; the reference quantizes block by block. Tall
  // 128x1 blocks are the weight-gradient GEMM's; odd shapes leave partial blocks on both edges.
  // A NaN, an infinity and an all-zero band check that the running max and scale-0 rule agree.
  const int64_t rows = 261, cols = 131;
  std::vector<float> x = random_matrix(rows, cols, 4);
  x[7 * cols + 3] = std::nanf("");
  x[140 * cols + 130] = INFINITY;
  for (int64_t c = 0; c < cols; ++c) x[260 * cols + c] = 0.0f;
  const int64_t shapes[][2] = {{128, 128}, {1, 128}, {128, 1}, {3, 5}, {1, 1}};
  for (FpFormat format : kAllFormats) {
    for (const auto& shape : shapes) {
      std::vector<uint8_t> codes(rows * cols);
      std::vector<float> scales(fp_blockwise_scale_count(rows, cols, shape[0], shape[1]));
      std::vector<float> restored(rows * cols), fake(rows * cols);
      quantize_fp_blockwise(x.data(), rows, cols, shape[0], shape[1], format, codes.data(),
                            scales.data());
      dequantize_fp_blockwise(codes.data(), scales.data(), rows, cols, shape[0], shape[1], format,
                              restored.data());
      fake_quantize_fp_blockwise(x.data(), rows, cols, shape[0], shape[1], format, fake.data());
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_EQ(float_bits(fake[i]), float_bits(restored[i]))
            << fp_format_name(format) << " blocks " << shape[0] << "x" << shape[1] << " element "
            << i;
      }
    }
  }
}

TEST(QuantizeFineGrained, PartialTilesAndBlocksGetTheirOwnScales) {
  // Tiles: cols = 300 -> 128, 128, 44. Blocks: rows = 200, cols = 300 -> 2 x 3, the last
  // row of blocks 72 tall and the last column 44 wide.
  const int64_t rows = 200, cols = 300;
  std::vector<float> x(rows * cols, 1.0f);
  x[0] = 1000.0f;              // in tile (0, 0) and block (0, 0) only
  x[5 * cols + 299] = -8.0f;   // last partial tile of row 5, block (0, 2)
  x[199 * cols + 299] = 3.0f;  // last partial block (1, 2)
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> tile_scales(fp_blockwise_scale_count(rows, cols, 1, 128));
  ASSERT_EQ(tile_scales.size(), size_t(rows * 3));
  quantize_fp_tile_1x128(x.data(), rows, cols, FpFormat::kE4M3, codes.data(), tile_scales.data());
  EXPECT_EQ(tile_scales[0], 1000.0f / 448.0f);
  EXPECT_EQ(tile_scales[1], 1.0f / 448.0f);
  EXPECT_EQ(tile_scales[5 * 3 + 2], 8.0f / 448.0f);
  EXPECT_EQ(tile_scales[6 * 3 + 2], 1.0f / 448.0f);
  EXPECT_EQ(codes[5 * cols + 299], 0xFE);  // -448

  std::vector<float> block_scales(fp_blockwise_scale_count(rows, cols, 128, 128));
  ASSERT_EQ(block_scales.size(), 6u);
  quantize_fp_block_128x128(x.data(), rows, cols, FpFormat::kE3M2, codes.data(),
                            block_scales.data());
  EXPECT_EQ(block_scales[0], 1000.0f / 28.0f);
  EXPECT_EQ(block_scales[1], 1.0f / 28.0f);
  EXPECT_EQ(block_scales[2], 8.0f / 28.0f);
  EXPECT_EQ(block_scales[3], 1.0f / 28.0f);
  EXPECT_EQ(block_scales[5], 3.0f / 28.0f);
  EXPECT_EQ(decode_fp8_e4m3(codes[199 * cols + 299]), 28.0f);  // stored as the e4m3 code of 28
}

TEST(QuantizeFineGrained, AllZeroTileHasZeroScaleAndZeroCodes) {
  std::vector<float> x(256, 0.0f);
  x[200] = 2.0f;
  std::vector<uint8_t> codes(256, 0xAA);
  std::vector<float> scales(2, -1.0f);
  quantize_fp_tile_1x128(x.data(), 1, 256, FpFormat::kE4M3, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 0.0f);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(codes[i], 0);
  std::vector<float> restored(256);
  dequantize_fp_tile_1x128(codes.data(), scales.data(), 1, 256, FpFormat::kE4M3, restored.data());
  EXPECT_EQ(restored, x);
}

}  // namespace
}  // namespace gnmr
