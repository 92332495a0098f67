// The CUDA backend's GEMM plans and scale layouts, checked on the CPU: the plan of every role
// and path, the scale index maps, and cuBLASLt's block-scaled GEMM (emulated from its
// definition, reading the plan's layouts) against the fake-quantize + fp32 GEMM path the CPU
// backend runs.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/block_scaled_gemm_reference.h"
#include "backend/cuda/gemm_plan.h"
#include "backend/cuda/int8_gemm_reference.h"
#include "config/config.h"
#include "precision/fake_quantize_int.h"
#include "precision/quantize_fine_grained.h"
#include "precision/quantize_groupwise.h"
#include "precision/scale_layout.h"
#include "test_paths.h"

namespace gnmr {
namespace {

PathSpec fp_path(FpFormat format, int64_t tile = 128) {
  PathSpec p;
  p.kind = PathKind::kFineGrainedFp;
  p.format = format;
  p.tile = tile;
  return p;
}

PathSpec kind_path(PathKind kind) {
  PathSpec p;
  p.kind = kind;
  return p;
}

GemmPlan plan(GemmRole role, const PathSpec& path, int sm = 90, int64_t n = 192, int64_t in = 656,
              int64_t out = 320, GemmPrecision precision = GemmPrecision::FP32) {
  return plan_gemm(role, n, in, out, path, precision, GpuTarget{sm}, false);
}

// The forward of plan()'s shape as a TN GEMM on W and x as stored: y^T = W x^T.
void expect_tn_forward_of_the_test_shape(const GemmPlan& f) {
  EXPECT_EQ(f.m, 320);
  EXPECT_EQ(f.n, 192);
  EXPECT_EQ(f.k, 656);
  EXPECT_TRUE(f.transa);
  EXPECT_FALSE(f.transb);
  EXPECT_EQ(f.a.tensor, "W");
  EXPECT_EQ(f.b.tensor, "x");
}

TEST(CudaGemmPlan, Fp8RolesAreTnWithTheTransposedCopiesAndScaleModes) {
  const GemmPlan f = plan(GemmRole::kForward, fp_path(FpFormat::kE4M3));
  EXPECT_EQ(f.impl, GemmImpl::kFp8Block);
  expect_tn_forward_of_the_test_shape(f);
  EXPECT_FALSE(f.a.transposed_copy || f.b.transposed_copy);
  EXPECT_EQ(f.a.scale_mode, ScaleMode::kBlk128x128);
  EXPECT_EQ(f.b.scale_mode, ScaleMode::kVec128);
  EXPECT_EQ(f.lda, 656);
  EXPECT_EQ(f.ldb, 656);
  EXPECT_EQ(f.ldc, 320);
  EXPECT_EQ(f.beta, 0.0f);
  // W [320, 656]: 3 row blocks x L4 = round_up(6, 4) = 8; x: 192 rows x 6 blocks.
  EXPECT_EQ(f.a.scale_count, 3 * 8);
  EXPECT_EQ(f.b.scale_count, 192 * 6);

  const GemmPlan d = plan(GemmRole::kInputGradient, fp_path(FpFormat::kE4M3));
  EXPECT_EQ(d.impl, GemmImpl::kFp8Block);
  EXPECT_EQ(d.m, 656);
  EXPECT_EQ(d.n, 192);
  EXPECT_EQ(d.k, 320);
  EXPECT_TRUE(d.transa && !d.transb);
  EXPECT_EQ(d.a.tensor, "W^T");
  EXPECT_TRUE(d.a.transposed_copy);
  EXPECT_EQ(d.a.rows, 656);
  EXPECT_EQ(d.a.cols, 320);
  EXPECT_EQ(d.lda, 320);
  EXPECT_EQ(d.a.scale_mode, ScaleMode::kBlk128x128);
  EXPECT_EQ(d.a.scale_count, 6 * 4);  // 6 row blocks of W^T x L4 = round_up(3, 4)
  EXPECT_EQ(d.b.tensor, "dy");
  EXPECT_EQ(d.b.scale_mode, ScaleMode::kVec128);

  const GemmPlan w = plan(GemmRole::kWeightGradient, fp_path(FpFormat::kE2M1));
  EXPECT_EQ(w.impl, GemmImpl::kFp8Block);  // fp4 is stored as e4m3 codes: the same GEMM
  EXPECT_EQ(w.m, 656);
  EXPECT_EQ(w.n, 320);
  EXPECT_EQ(w.k, 192);
  EXPECT_EQ(w.a.tensor, "x^T");
  EXPECT_EQ(w.b.tensor, "dy^T");
  EXPECT_TRUE(w.a.transposed_copy && w.b.transposed_copy);
  EXPECT_EQ(w.a.type, GemmOperandType::kE4M3);
  EXPECT_EQ(w.a.scale_mode, ScaleMode::kVec128);
  EXPECT_EQ(w.b.scale_mode, ScaleMode::kVec128);
  EXPECT_EQ(w.lda, 192);
  EXPECT_EQ(w.ldb, 192);
  EXPECT_EQ(w.beta, 1.0f);  // dW += always
}

TEST(CudaGemmPlan, Bf16AndFp32TakeTheTensorsAsStored) {
  for (GemmImpl want : {GemmImpl::kBf16, GemmImpl::kFp32}) {
    const GemmPrecision precision =
        want == GemmImpl::kBf16 ? GemmPrecision::BF16 : GemmPrecision::FP32;
    for (PathKind kind : {PathKind::kBackendGemm, PathKind::kSavedIntGroupwise}) {
      const GemmPlan f = plan(GemmRole::kForward, kind_path(kind), 90, 192, 656, 320, precision);
      const GemmPlan d =
          plan(GemmRole::kInputGradient, kind_path(kind), 90, 192, 656, 320, precision);
      const GemmPlan w =
          plan(GemmRole::kWeightGradient, kind_path(kind), 90, 192, 656, 320, precision);
      for (const GemmPlan* p : {&f, &d, &w}) {
        EXPECT_EQ(p->impl, want);
        EXPECT_FALSE(p->a.transposed_copy || p->b.transposed_copy);
        EXPECT_EQ(p->a.scale_mode, ScaleMode::kNone);
      }
      // forward TN; input gradient NN with W [out, in] as A (column-major in x out, lda = in);
      // weight gradient NT with x (column-major in x N, lda = in) and dy (ldb = out).
      EXPECT_TRUE(f.transa && !f.transb);
      EXPECT_TRUE(!d.transa && !d.transb);
      EXPECT_EQ(d.a.tensor, "W");
      EXPECT_EQ(d.lda, 656);
      EXPECT_EQ(d.ldb, 320);
      EXPECT_TRUE(!w.transa && w.transb);
      EXPECT_EQ(w.lda, 656);
      EXPECT_EQ(w.ldb, 320);
      EXPECT_EQ(w.ldc, 656);
    }
  }
  EXPECT_EQ(plan(GemmRole::kForward, kind_path(PathKind::kBf16Gemm)).impl, GemmImpl::kBf16);
  EXPECT_EQ(plan(GemmRole::kForward, kind_path(PathKind::kBf16Gemm)).a.type,
            GemmOperandType::kBF16);
  // The accumulate flag sets beta for the forward and input gradient.
  EXPECT_EQ(plan_gemm(GemmRole::kInputGradient, 192, 656, 320, kind_path(PathKind::kBf16Gemm),
                      GemmPrecision::FP32, GpuTarget{90}, true)
                .beta,
            1.0f);
}

TEST(CudaGemmPlan, Int8ForwardIsATnInt8GemmWithOneScalePerRowAppliedAfter) {
  const GemmPlan f = plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm), 80);
  EXPECT_EQ(f.impl, GemmImpl::kInt8);  // IMMA: sm_80 too
  EXPECT_TRUE(f.emulated_because.empty()) << f.emulated_because;
  expect_tn_forward_of_the_test_shape(f);
  EXPECT_EQ(f.a.type, GemmOperandType::kS8);
  EXPECT_EQ(f.b.type, GemmOperandType::kS8);
  EXPECT_FALSE(f.a.transposed_copy || f.b.transposed_copy);
  EXPECT_EQ(f.a.scale_mode, ScaleMode::kRowAfterGemm);
  EXPECT_EQ(f.b.scale_mode, ScaleMode::kRowAfterGemm);
  EXPECT_EQ(f.a.scale_count, 320);  // one per output channel
  EXPECT_EQ(f.b.scale_count, 192);  // one per token
  EXPECT_EQ(f.lda, 656);
  EXPECT_EQ(f.ldb, 656);
  EXPECT_EQ(f.ldc, 320);
  EXPECT_EQ(f.beta, 0.0f);
  EXPECT_EQ(f.d_type, GemmOperandType::kS32);
  EXPECT_STREQ(gemm_impl_name(f.impl), "int8");
  // Every other plan writes fp32.
  EXPECT_EQ(plan(GemmRole::kForward, fp_path(FpFormat::kE4M3)).d_type, GemmOperandType::kF32);
  // The int32 bound is the exact one.
  EXPECT_LE(kInt8GemmMaxK * 127 * 127, int64_t{INT32_MAX});
  EXPECT_GT((kInt8GemmMaxK + 1) * 127 * 127, int64_t{INT32_MAX});
  EXPECT_EQ(plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm), 90, 8, kInt8GemmMaxK, 64).impl,
            GemmImpl::kInt8);
}

TEST(CudaGemmPlan, WhatCublasLtCannotTakeIsEmulatedAndSaysWhy) {
  struct Case {
    GemmPlan plan;
    const char* reason_contains;
  };
  const Case cases[] = {
      {plan(GemmRole::kForward, fp_path(FpFormat::kE4M3), 80), "sm_80"},
      {plan(GemmRole::kForward, fp_path(FpFormat::kE5M2)), "e5m2"},
      {plan(GemmRole::kForward, fp_path(FpFormat::kE4M3, 64)), "tile 64"},
      // ffn 5461 (configs/models/llama2-1b.json) cannot take FP8.
      {plan(GemmRole::kForward, fp_path(FpFormat::kE4M3), 90, 1024, 2048, 5461), "5461"},
      {plan(GemmRole::kWeightGradient, fp_path(FpFormat::kE4M3), 90, 100, 2048, 2048), "100"},
      {plan(GemmRole::kInputGradient, kind_path(PathKind::kInt8Gemm)), "int8 input gradient"},
      // int8's forward: IMMA needs m and k multiples of 4, and int32 sums that cannot overflow.
      {plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm), 90, 192, 654, 320), "654"},
      {plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm), 90, 192, 656, 322), "322"},
      {plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm), 90, 8, kInt8GemmMaxK + 4, 64),
       "overflow"},
      {plan_gemm(GemmRole::kForward, 192, 656, 320, kind_path(PathKind::kInt8Gemm),
                 GemmPrecision::FP32, GpuTarget{90}, true),
       "accumulate"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.plan.impl, GemmImpl::kEmulated) << c.reason_contains;
    EXPECT_NE(c.plan.emulated_because.find(c.reason_contains), std::string::npos)
        << c.plan.emulated_because;
    EXPECT_EQ(c.plan.a.type, GemmOperandType::kF32);
    EXPECT_FALSE(c.plan.a.transposed_copy);
  }
  // int8's weight gradient is the recipe's bf16 GEMM; a good FP8 shape says nothing.
  EXPECT_EQ(plan(GemmRole::kWeightGradient, kind_path(PathKind::kInt8Gemm)).impl, GemmImpl::kBf16);
  EXPECT_TRUE(plan(GemmRole::kForward, fp_path(FpFormat::kE4M3)).emulated_because.empty());
  EXPECT_STREQ(gemm_impl_name(GemmImpl::kFp8Block), "fp8_block");
  EXPECT_STREQ(gemm_role_name(GemmRole::kWeightGradient), "weight_gradient");
}

// Every projection GEMM of a model config: q, k, v, o, gate, up, down, each role.
std::vector<GemmPlan> fp8_plans_of(const std::string& config, int64_t tokens) {
  const ModelConfig m = load_run_config(gnmr_test::source_path(config), {}).model;
  const int64_t d = m.dim, kv = int64_t(m.n_kv_heads) * m.head_dim(), f = m.ffn_dim;
  const int64_t shapes[][2] = {{d, d}, {d, kv}, {d, kv}, {d, d}, {d, f}, {d, f}, {f, d}};
  std::vector<GemmPlan> plans;
  for (const auto& s : shapes)
    for (GemmRole role : {GemmRole::kForward, GemmRole::kInputGradient, GemmRole::kWeightGradient})
      plans.push_back(plan_gemm(role, tokens, s[0], s[1], fp_path(FpFormat::kE4M3),
                                GemmPrecision::FP32, GpuTarget{90}, false));
  return plans;
}

TEST(CudaGemmPlan, TheGpuConfigsRunEveryFp8GemmForReal) {
  for (const char* config : {"configs/models/llama2-1b-gpu.json", "configs/models/tiny-gpu.json"}) {
    for (const GemmPlan& p : fp8_plans_of(config, 8 * 128)) {
      EXPECT_EQ(p.impl, GemmImpl::kFp8Block) << config << ": " << p.emulated_because;
    }
  }
  // llama2-1b's ffn 5461 sends its MLP GEMMs to the emulated path, and says so.
  int emulated = 0;
  for (const GemmPlan& p : fp8_plans_of("configs/models/llama2-1b.json", 8 * 1024)) {
    if (p.impl == GemmImpl::kEmulated) {
      ++emulated;
      EXPECT_NE(p.emulated_because.find("5461"), std::string::npos) << p.emulated_because;
    }
  }
  EXPECT_EQ(emulated, 9);  // gate, up, down x 3 roles
}

TEST(CudaScaleLayout, IndexMapsAreBijectionsOntoTheDocumentedOrders) {
  // VEC128: row fastest. rows 5, k 300 -> 3 blocks.
  std::set<int64_t> seen;
  for (int64_t kb = 0; kb < 3; ++kb)
    for (int64_t r = 0; r < 5; ++r) seen.insert(vec128_scale_index(r, kb, 5));
  EXPECT_EQ(seen.size(), 15u);
  EXPECT_EQ(*seen.rbegin(), vec128_scale_count(5, 300) - 1);
  EXPECT_EQ(vec128_scale_index(1, 0, 5), 1);
  EXPECT_EQ(vec128_scale_index(0, 1, 5), 5);

  // BLK128x128: k-block fastest, row-block stride L4 = round_up(L, 4).
  EXPECT_EQ(blk128_scale_stride(128), 4);
  EXPECT_EQ(blk128_scale_stride(640), 8);    // L = 5
  EXPECT_EQ(blk128_scale_stride(2048), 16);  // L = 16, already a multiple of 4
  EXPECT_EQ(blk128_scale_index(0, 1, 640), 1);
  EXPECT_EQ(blk128_scale_index(1, 0, 640), 8);
  EXPECT_EQ(blk128_scale_count(300, 640), 3 * 8);

  // Conversions from the CPU grids, with the L4 padding left zero.
  const std::vector<float> row_tiles = {1, 2, 3, 4, 5, 6};  // CPU [rows 2, L 3]
  EXPECT_EQ(vec128_from_row_tiles(row_tiles.data(), 2, 300),
            (std::vector<float>{1, 4, 2, 5, 3, 6}));
  const std::vector<float> column_tiles = {1, 2, 3, 4, 5, 6};  // CPU [L 3, rows 2]
  EXPECT_EQ(vec128_from_column_tiles(column_tiles.data(), 2, 300), column_tiles);
  const std::vector<float> blocks = {1, 2, 3, 4, 5, 6};  // CPU [row blocks 2, L 3]
  EXPECT_EQ(blk128_from_blocks(blocks.data(), 200, 300, false),
            (std::vector<float>{1, 2, 3, 0, 4, 5, 6, 0}));
  // Transposed: the CPU grid is [L 3, row blocks 2] of the tensor the operand transposes.
  EXPECT_EQ(blk128_from_blocks(blocks.data(), 200, 300, true),
            (std::vector<float>{1, 3, 5, 0, 2, 4, 6, 0}));
}

// ---- the emulated cuBLASLt FP8 GEMM vs the CPU's fake-quantize + fp32 GEMM ----

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  // Magnitudes spread over 2^-6 .. 2^6 per 64-element stripe, so tiles get different scales.
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> m(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[size_t(r * cols + c)] = normal(rng) * std::ldexp(1.0f, int((r * 7 + c / 64) % 13) - 6);
  return m;
}

std::vector<float> fake(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t br,
                        int64_t bc, FpFormat format) {
  std::vector<float> out(x.size());
  fake_quantize_fp_blockwise(x.data(), rows, cols, br, bc, format, out.data());
  return out;
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // CPU order
};

Quantized quantize(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                   FpFormat format) {
  Quantized q;
  q.codes.resize(x.size());
  q.scales.resize(fp_blockwise_scale_count(rows, cols, br, bc));
  quantize_fp_blockwise(x.data(), rows, cols, br, bc, format, q.codes.data(), q.scales.data());
  return q;
}

std::vector<uint8_t> transpose(const std::vector<uint8_t>& codes, int64_t rows, int64_t cols) {
  std::vector<uint8_t> t(codes.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = codes[size_t(r * cols + c)];
  return t;
}

// Relative Frobenius distance.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

constexpr int64_t kN = 192, kIn = 656, kOut = 320;  // k / 128 = 5.1, 2.5, 1.5: partial blocks

class CudaBlockScaledGemm : public ::testing::TestWithParam<FpFormat> {};

TEST_P(CudaBlockScaledGemm, EveryRoleEqualsTheFakeQuantizedFp32Gemm) {
  const FpFormat format = GetParam();
  const std::vector<float> x = random_matrix(kN, kIn, 1), w = random_matrix(kOut, kIn, 2),
                           dy = random_matrix(kN, kOut, 3);
  const PathSpec path = fp_path(format);

  {  // forward: y [N, out] = x W^T, x in 1 x 128 tiles, W in 128 x 128 blocks
    const GemmPlan p = plan(GemmRole::kForward, path);
    const std::vector<float> xq = fake(x, kN, kIn, 1, 128, format),
                             wq = fake(w, kOut, kIn, 128, 128, format);
    std::vector<double> want(size_t(kN * kOut));
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t o = 0; o < kOut; ++o) {
        double s = 0;
        for (int64_t i = 0; i < kIn; ++i)
          s += double(xq[size_t(n * kIn + i)]) * wq[size_t(o * kIn + i)];
        want[size_t(n * kOut + o)] = s;  // D column-major out x N = y row-major
      }
    const Quantized wc = quantize(w, kOut, kIn, 128, 128, format),
                    xc = quantize(x, kN, kIn, 1, 128, format);
    std::vector<float> d(want.size(), 0.0f);
    block_scaled_gemm_reference(p, format, wc.codes,
                                blk128_from_blocks(wc.scales.data(), kOut, kIn, false), xc.codes,
                                vec128_from_row_tiles(xc.scales.data(), kN, kIn), d);
    EXPECT_LT(relative_error(d, want), 1e-6) << "forward";

    // The check can fail: handing cuBLASLt the CPU's row-major tile order as VEC128 is wrong.
    std::vector<float> cpu_order = xc.scales;
    std::vector<float> misread(want.size(), 0.0f);
    block_scaled_gemm_reference(p, format, wc.codes,
                                blk128_from_blocks(wc.scales.data(), kOut, kIn, false), xc.codes,
                                cpu_order, misread);
    EXPECT_GT(relative_error(misread, want), 0.1) << "the CPU scale order read as VEC128";
  }
  {  // input gradient: dx [N, in] = dy W, A = W^T codes, B = dy in 1 x 128 tiles along out
    const GemmPlan p = plan(GemmRole::kInputGradient, path);
    const std::vector<float> dyq = fake(dy, kN, kOut, 1, 128, format),
                             wq = fake(w, kOut, kIn, 128, 128, format);
    std::vector<double> want(size_t(kN * kIn));
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t i = 0; i < kIn; ++i) {
        double s = 0;
        for (int64_t o = 0; o < kOut; ++o)
          s += double(dyq[size_t(n * kOut + o)]) * wq[size_t(o * kIn + i)];
        want[size_t(n * kIn + i)] = s;
      }
    const Quantized wc = quantize(w, kOut, kIn, 128, 128, format),
                    dyc = quantize(dy, kN, kOut, 1, 128, format);
    std::vector<float> d(want.size(), 0.0f);
    block_scaled_gemm_reference(p, format, transpose(wc.codes, kOut, kIn),
                                blk128_from_blocks(wc.scales.data(), kIn, kOut, true), dyc.codes,
                                vec128_from_row_tiles(dyc.scales.data(), kN, kOut), d);
    EXPECT_LT(relative_error(d, want), 1e-6) << "input gradient";
  }
  {  // weight gradient: dW [out, in] += dy^T x, both in 128 x 1 tiles along N
    const GemmPlan p = plan(GemmRole::kWeightGradient, path);
    const std::vector<float> xq = fake(x, kN, kIn, 128, 1, format),
                             dyq = fake(dy, kN, kOut, 128, 1, format);
    std::vector<double> want(size_t(kOut * kIn));
    std::vector<float> d(want.size());
    for (int64_t o = 0; o < kOut; ++o)
      for (int64_t i = 0; i < kIn; ++i) {
        double s = 0.5;  // dW holds a previous micro-step's gradient: beta = 1
        d[size_t(o * kIn + i)] = 0.5f;
        for (int64_t n = 0; n < kN; ++n)
          s += double(dyq[size_t(n * kOut + o)]) * xq[size_t(n * kIn + i)];
        want[size_t(o * kIn + i)] = s;
      }
    const Quantized xc = quantize(x, kN, kIn, 128, 1, format),
                    dyc = quantize(dy, kN, kOut, 128, 1, format);
    block_scaled_gemm_reference(p, format, transpose(xc.codes, kN, kIn),
                                vec128_from_column_tiles(xc.scales.data(), kIn, kN),
                                transpose(dyc.codes, kN, kOut),
                                vec128_from_column_tiles(dyc.scales.data(), kOut, kN), d);
    EXPECT_LT(relative_error(d, want), 1e-6) << "weight gradient";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaBlockScaledGemm,
                         ::testing::Values(FpFormat::kE4M3, FpFormat::kE3M2, FpFormat::kE2M1));

TEST(CudaBlockScaledGemm, DoublingOneBlockScaleChangesOnlyThatBlocksOutputs) {
  // Forward, W's block (row block 1, k block 2): only outputs of rows 128..255 (D's m index) may
  // change, and all of them do (each sums over k block 2).
  const FpFormat format = FpFormat::kE4M3;
  const GemmPlan p = plan(GemmRole::kForward, fp_path(format));
  const std::vector<float> x = random_matrix(kN, kIn, 4), w = random_matrix(kOut, kIn, 5);
  const Quantized wc = quantize(w, kOut, kIn, 128, 128, format),
                  xc = quantize(x, kN, kIn, 1, 128, format);
  std::vector<float> ws = blk128_from_blocks(wc.scales.data(), kOut, kIn, false);
  const std::vector<float> xs = vec128_from_row_tiles(xc.scales.data(), kN, kIn);
  std::vector<float> base(size_t(kOut * kN), 0.0f), bumped(base.size(), 0.0f);
  block_scaled_gemm_reference(p, format, wc.codes, ws, xc.codes, xs, base);
  ws[size_t(blk128_scale_index(1, 2, kIn))] *= 2.0f;
  block_scaled_gemm_reference(p, format, wc.codes, ws, xc.codes, xs, bumped);
  int changed_inside = 0, changed_outside = 0;
  for (int64_t j = 0; j < kN; ++j)
    for (int64_t i = 0; i < kOut; ++i) {
      const bool changed = base[size_t(i + j * kOut)] != bumped[size_t(i + j * kOut)];
      (i >= 128 && i < 256 ? changed_inside : changed_outside) += changed;
    }
  EXPECT_EQ(changed_outside, 0);
  EXPECT_GT(changed_inside, 128 * kN * 9 / 10);
}

// ---- the int8 GEMM's CPU twin vs the exact product and the CPU's fake-quantize path ----

struct Int8Rows {
  std::vector<int8_t> codes;
  std::vector<float> scales;  // one per row
};

// What the CUDA backend's quantizer writes: int group-wise, 8 bits, one group per row.
Int8Rows int8_rows(const std::vector<float>& x, int64_t rows, int64_t cols) {
  Int8Rows q;
  std::vector<uint8_t> packed(size_t(rows * cols));
  q.scales.resize(size_t(rows));
  quantize_int_groupwise(x.data(), rows, cols, GroupwiseSpec{8, kGroupRow, false}, packed.data(),
                         q.scales.data());
  q.codes.resize(packed.size());
  std::memcpy(q.codes.data(), packed.data(), packed.size());  // 8-bit fields: two's complement
  return q;
}

TEST(CudaInt8Gemm, TheCpuTwinIsTheExactProductWithinThreeRoundingsAndMatchesTheFakeQuantPath) {
  const std::vector<float> x = random_matrix(kN, kIn, 7), w = random_matrix(kOut, kIn, 8);
  const GemmPlan p = plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm));
  ASSERT_EQ(p.impl, GemmImpl::kInt8);
  const Int8Rows wc = int8_rows(w, kOut, kIn), xc = int8_rows(x, kN, kIn);
  // The codes times their scales are, bit for bit, what the CPU's int8 path multiplies.
  std::vector<float> wq(w.size()), xq(x.size());
  fake_quantize_int_per_row(w.data(), kOut, kIn, 8, wq.data());
  fake_quantize_int_per_row(x.data(), kN, kIn, 8, xq.data());
  for (int64_t o = 0; o < kOut; ++o)
    for (int64_t i = 0; i < kIn; ++i) {
      const size_t e = size_t(o * kIn + i);
      ASSERT_EQ(float_bits(float(wc.codes[e]) * wc.scales[size_t(o)]), float_bits(wq[e]));
    }
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t i = 0; i < kIn; ++i) {
      const size_t e = size_t(n * kIn + i);
      ASSERT_EQ(float_bits(float(xc.codes[e]) * xc.scales[size_t(n)]), float_bits(xq[e]));
    }
  std::vector<float> d;
  int8_gemm_reference(p, wc.codes, wc.scales, xc.codes, xc.scales, d);
  ASSERT_EQ(d.size(), size_t(kOut * kN));
  int checked = 0;
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t o = 0; o < kOut; ++o) {
      int64_t sum = 0;
      double fake_sum = 0, fake_abs = 0;
      for (int64_t i = 0; i < kIn; ++i) {
        sum += int64_t{wc.codes[size_t(o * kIn + i)]} * xc.codes[size_t(n * kIn + i)];
        const double t = double(wq[size_t(o * kIn + i)]) * xq[size_t(n * kIn + i)];
        fake_sum += t;
        fake_abs += std::fabs(t);
      }
      const double exact = double(sum) * wc.scales[size_t(o)] * xc.scales[size_t(n)];
      const double got = d[size_t(o + n * kOut)];  // D column-major out x N
      // The exact sum, then three fp32 roundings (precision/int8_gemm_output.h).
      ASSERT_LE(std::fabs(got - exact), 3.0001 * std::ldexp(1.0, -24) * std::fabs(exact))
          << "n " << n << " o " << o;
      // The fake-quantized values each carry one rounding of code * scale: at most 2^-23 per
      // product of two, relative to the sum of |products|.
      ASSERT_LE(std::fabs(got - fake_sum), 3.0001 * std::ldexp(1.0, -24) * std::fabs(exact) +
                                               2.0001 * std::ldexp(1.0, -24) * fake_abs)
          << "n " << n << " o " << o;
      ++checked;
    }
  EXPECT_EQ(checked, kN * kOut);
}

TEST(CudaInt8Gemm, TheCpuTwinReadsEachRowsOwnScaleAndCodes) {
  // A swapped scale or a transposed operand changes the output: the test above would not
  // notice a rule applied symmetrically to both operands, this one does.
  const std::vector<float> x = random_matrix(kN, kIn, 9), w = random_matrix(kOut, kIn, 10);
  const GemmPlan p = plan(GemmRole::kForward, kind_path(PathKind::kInt8Gemm));
  Int8Rows wc = int8_rows(w, kOut, kIn);
  const Int8Rows xc = int8_rows(x, kN, kIn);
  std::vector<float> before, after;
  int8_gemm_reference(p, wc.codes, wc.scales, xc.codes, xc.scales, before);
  wc.scales[5] *= 2.0f;  // output channel 5
  int8_gemm_reference(p, wc.codes, wc.scales, xc.codes, xc.scales, after);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t o = 0; o < kOut; ++o) {
      const size_t e = size_t(o + n * kOut);
      if (o == 5) {
        EXPECT_EQ(after[e], 2.0f * before[e]);
      } else {
        EXPECT_EQ(float_bits(after[e]), float_bits(before[e]));
      }
    }
}

}  // namespace
}  // namespace gnmr
