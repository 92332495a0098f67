// The precision-recipe ops of the CPU backend (backend.h "precision-recipe ops") against the
// src/precision reference functions they call: equal bytes and equal bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_tensors.h"
#include "precision/bf16.h"
#include "precision/quantize_fine_grained.h"
#include "precision/quantize_groupwise.h"

namespace gnmr {
namespace {

using testing::download;
using testing::upload;

// Rows of normal noise with magnitudes spread over 2^-6..2^6, so scales differ per row.
std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 13) - 6);
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = magnitude * normal(rng);
  }
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(QuantizeOps, IntGroupwiseWritesTheReferenceBytesAndScales) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 24, cols = 96;
  const std::vector<float> x = random_matrix(rows, cols, 1);
  const Tensor xt = upload(*be, x, {rows, cols});
  for (int bits : {2, 3, 4, 8}) {
    for (int group : {32, 96, kGroupRow, kGroupTensor}) {
      for (bool stochastic : {false, true}) {
        const GroupwiseSpec spec{bits, group, stochastic};
        const RngKey key{7, 3, 11};
        const GroupwiseQuantized ref = quantize_int_groupwise(x.data(), rows, cols, spec, key);
        // Buffers larger than needed, as a unit planned for its largest path has.
        Tensor packed = be->allocate("packed", {rows * cols}, DType::U8, MemoryRole::Scratch);
        Tensor scales = be->allocate("scales", {rows * cols}, DType::F32, MemoryRole::Scratch);
        be->quantize_int_groupwise(xt, packed, scales, spec, key);
        std::vector<uint8_t> got_packed = download<uint8_t>(*be, packed);
        std::vector<float> got_scales = download<float>(*be, scales);
        got_packed.resize(ref.packed.size());
        got_scales.resize(ref.scales.size());
        EXPECT_EQ(got_packed, ref.packed) << bits << " bits, group " << group;
        EXPECT_TRUE(same_bits(got_scales, ref.scales)) << bits << " bits, group " << group;

        Tensor out = be->allocate("out", {rows, cols}, DType::F32, MemoryRole::Scratch);
        be->dequantize_int_groupwise(packed, scales, spec, out);
        std::vector<float> restored(x.size());
        dequantize_int_groupwise(ref, restored.data());
        EXPECT_TRUE(same_bits(download<float>(*be, out), restored));
      }
    }
  }
}

TEST(QuantizeOps, IntGroupwiseRejectsBuffersSmallerThanThePackedSize) {
  auto be = make_cpu_backend(1);
  const Tensor x = upload(*be, random_matrix(4, 64, 2), {4, 64});
  Tensor packed =
      be->allocate("packed", {4 * 32 - 1}, DType::U8, MemoryRole::Scratch);  // int4 needs 4 * 32
  Tensor scales = be->allocate("scales", {8}, DType::F32, MemoryRole::Scratch);
  EXPECT_ANY_THROW(be->quantize_int_groupwise(x, packed, scales, GroupwiseSpec{4, 32, false}, {}));
  Tensor packed_ok = be->allocate("packed", {4 * 32}, DType::U8, MemoryRole::Scratch);
  EXPECT_ANY_THROW(be->quantize_int_groupwise(x, packed_ok, scales, GroupwiseSpec{4, 16, false},
                                              {}));  // needs 16 scales
}

TEST(QuantizeOps, FakeQuantizeFpBlockwiseEqualsTheReferenceForEveryFormatAndBlockShape) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 150, cols = 200;  // partial tiles at both edges
  std::vector<float> x = random_matrix(rows, cols, 3);
  // Special values in some tiles: the backend runs a copy of the quantizer compiled for this
  // CPU's widest vectors (isa_clones.h), this test the baseline build of the same code.
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min()};
  for (size_t i = 0; i < x.size(); i += 97) x[i] = specials[(i / 97) % 8];
  std::fill(x.begin() + 140 * cols, x.begin() + 141 * cols, 0.0f);  // an all-zero 1x128 tile
  for (int64_t c = 0; c < cols; ++c) x[3 * cols + c] *= 1e-30f;     // tiny tiles
  const Tensor xt = upload(*be, x, {rows, cols});
  Tensor out = be->allocate("out", {rows, cols}, DType::F32, MemoryRole::Scratch);
  for (FpFormat format :
       {FpFormat::kE4M3, FpFormat::kE5M2, FpFormat::kE3M2, FpFormat::kE2M3, FpFormat::kE2M1}) {
    for (auto [br, bc] : {std::pair<int64_t, int64_t>{1, 128}, {128, 128}, {128, 1}}) {
      std::vector<float> ref(x.size());
      fake_quantize_fp_blockwise(x.data(), rows, cols, br, bc, format, ref.data());
      be->fake_quantize_fp_blockwise(xt, out, format, br, bc);
      EXPECT_TRUE(same_bits(download<float>(*be, out), ref))
          << fp_format_name(format) << " " << br << "x" << bc;
    }
  }
}

TEST(QuantizeOps, FakeQuantizeInt8PerRowEqualsPackedRoundTripPerRow) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 33, cols = 172;  // a width no power-of-two group divides
  std::vector<float> x = random_matrix(rows, cols, 4);
  std::fill(x.begin() + 5 * cols, x.begin() + 6 * cols, 0.0f);  // an all-zero row: scale 0
  const GroupwiseSpec per_row{8, kGroupRow, false};
  const GroupwiseQuantized q = quantize_int_groupwise(x.data(), rows, cols, per_row);
  std::vector<float> ref(x.size());
  dequantize_int_groupwise(q, ref.data());
  Tensor xt = upload(*be, x, {rows, cols});
  Tensor out = be->allocate("out", {rows, cols}, DType::F32, MemoryRole::Scratch);
  be->fake_quantize_int8_per_row(xt, out);
  EXPECT_TRUE(same_bits(download<float>(*be, out), ref));
  be->fake_quantize_int8_per_row(xt, xt);  // in place
  EXPECT_TRUE(same_bits(download<float>(*be, xt), ref));
}

TEST(QuantizeOps, RoundToBf16EqualsTheFormatFunction) {
  auto be = make_cpu_backend(2);
  std::vector<float> x = random_matrix(17, 31, 5);
  x[0] = NAN;
  x[1] = -0.0f;
  x[2] = INFINITY;
  const Tensor xt = upload(*be, x, {17, 31});
  Tensor out = be->allocate("out", {17, 31}, DType::F32, MemoryRole::Scratch);
  be->round_to_bf16(xt, out);
  std::vector<float> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = round_to_bf16(x[i]);
  EXPECT_TRUE(same_bits(download<float>(*be, out), ref));
}

TEST(QuantizeOps, Fp32GemmOnRoundedInputsEqualsBf16GemmBitForBit) {
  // What the model's bf16 weight cache relies on: rounding once and running the GEMM on the
  // rounded copies gives the bits the per-call bf16 rounding gives.
  auto be = make_cpu_backend(2);
  const int64_t n = 40, in = 48, out = 36;
  const Tensor x = upload(*be, random_matrix(n, in, 6), {n, in});
  const Tensor w = upload(*be, random_matrix(out, in, 7), {out, in});
  const Tensor dy = upload(*be, random_matrix(n, out, 8), {n, out});
  Tensor xr = be->allocate("xr", {n, in}, DType::F32, MemoryRole::Scratch),
         wr = be->allocate("wr", {out, in}, DType::F32, MemoryRole::Scratch);
  Tensor dyr = be->allocate("dyr", {n, out}, DType::F32, MemoryRole::Scratch);
  be->round_to_bf16(x, xr);
  be->round_to_bf16(w, wr);
  be->round_to_bf16(dy, dyr);
  Tensor y1 = be->allocate("y1", {n, out}, DType::F32, MemoryRole::Scratch),
         y2 = be->allocate("y2", {n, out}, DType::F32, MemoryRole::Scratch);
  be->matmul_forward(x, w, y1, GemmPrecision::BF16);
  be->matmul_forward(xr, wr, y2, GemmPrecision::FP32);
  EXPECT_TRUE(same_bits(download<float>(*be, y1), download<float>(*be, y2)));
  Tensor dx1 = be->allocate("dx1", {n, in}, DType::F32, MemoryRole::Scratch),
         dx2 = be->allocate("dx2", {n, in}, DType::F32, MemoryRole::Scratch);
  be->matmul_backward_input(dy, w, dx1, false, GemmPrecision::BF16);
  be->matmul_backward_input(dyr, wr, dx2, false, GemmPrecision::FP32);
  EXPECT_TRUE(same_bits(download<float>(*be, dx1), download<float>(*be, dx2)));
  // The overload without a precision follows set_gemm_precision.
  be->set_gemm_precision(GemmPrecision::BF16);
  be->matmul_forward(x, w, y2);
  EXPECT_TRUE(same_bits(download<float>(*be, y1), download<float>(*be, y2)));
}

}  // namespace
}  // namespace gnmr
