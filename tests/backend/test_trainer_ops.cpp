// Trainer-facing backend ops (adamw_update, sum_squares, global_norm_clip,
// accumulate_mean_loss, scale), bf16 GEMM emulation, memory accounting, the sync counter and
// run-to-run determinism of the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/gradient_check.h"
#include "backend_tensors.h"
#include "precision/bf16.h"
#include "util/error.h"

namespace gnmr {
namespace {

using testing::download;
using testing::upload;

using testing::random_vector;

// An f64 tensor holding `host` (the trainer's scalars in backend memory).
Tensor upload_f64(Backend& be, const std::vector<double>& host) {
  Tensor t =
      be.allocate("test", {static_cast<int64_t>(host.size())}, DType::F64, MemoryRole::Scratch);
  be.copy_from_host(t, host.data());
  return t;
}

// The clip tensor global_norm_clip would write: {grad scale, finite flag}.
Tensor clip_tensor(Backend& be, float grad_scale, bool finite) {
  return upload(be, {grad_scale, finite ? 1.0f : 0.0f}, {2});
}

TEST(TrainerOps, AdamwUpdateMatchesHandComputedStep) {
  auto be = make_cpu_backend(2);
  Tensor p = upload(*be, {1.0f, -2.0f}, {2}), g = upload(*be, {0.5f, 0.0f}, {2});
  Tensor m = upload(*be, {0.1f, 0.2f}, {2}), v = upload(*be, {0.01f, 0.04f}, {2});
  AdamWStep s;
  s.lr = 0.1f;
  s.beta1 = 0.9f;
  s.beta2 = 0.99f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.step = 3;
  be->adamw_update(p, g, m, v, s, clip_tensor(*be, 0.5f, true));
  // element 0 by hand: g = 0.25, m = 0.9*0.1 + 0.1*0.25 = 0.115,
  // v = 0.99*0.01 + 0.01*0.0625 = 0.010525, bias1 = 1 - 0.9^3 = 0.271,
  // bias2 = 1 - 0.99^3 = 0.029701, p = 1 * (1 - 0.1*0.1) - 0.1/0.271 * 0.115 /
  // (sqrt(0.010525)/sqrt(0.029701) + 1e-8)
  const double p0 = 0.99 - 0.1 / 0.271 * 0.115 / (std::sqrt(0.010525) / std::sqrt(0.029701) + 1e-8);
  // element 1: g = 0, m = 0.18, v = 0.0396
  const double p1 =
      -2.0 * 0.99 - 0.1 / 0.271 * 0.18 / (std::sqrt(0.0396) / std::sqrt(0.029701) + 1e-8);
  const auto got_p = download(*be, p), got_m = download(*be, m), got_v = download(*be, v);
  // fp32 arithmetic on O(1) values, ~10 roundings: 1e-6 relative
  EXPECT_NEAR(got_p[0], p0, 1e-6);
  EXPECT_NEAR(got_p[1], p1, 2e-6);
  EXPECT_NEAR(got_m[0], 0.115, 1e-7);
  EXPECT_NEAR(got_v[0], 0.010525, 1e-8);
  EXPECT_NEAR(got_m[1], 0.18, 1e-7);
  EXPECT_NEAR(got_v[1], 0.0396, 1e-8);
}

TEST(TrainerOps, AdamwFirstStepMovesEachWeightByLearningRateTimesSign) {
  auto be = make_cpu_backend(1);
  Tensor p = upload(*be, {0.0f, 0.0f, 0.0f}, {3}), g = upload(*be, {3.0f, -1e-3f, 0.0f}, {3});
  Tensor m = be->allocate("m", {3}, DType::F32, MemoryRole::Scratch),
         v = be->allocate("v", {3}, DType::F32, MemoryRole::Scratch);
  AdamWStep s;
  s.lr = 0.01f;
  be->adamw_update(p, g, m, v, s, clip_tensor(*be, 1.0f, true));
  const auto got = download(*be, p);
  // m_hat = g, v_hat = g^2 after bias correction: the step is lr * g / (|g| + eps)
  EXPECT_NEAR(got[0], -0.01f, 1e-8);
  EXPECT_NEAR(got[1], 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-9);  // eps visible at |g| = 1e-3
  EXPECT_EQ(got[2], 0.0f);
}

TEST(TrainerOps, SumSquaresMatchesDoubleReferenceForAnyThreadCount) {
  // 200000 elements span several 65536-element chunks; an empty tensor gives 0.
  const std::vector<size_t> sizes = {3, 200000, 0, 1, 65536};
  std::vector<double> reference;
  std::vector<std::vector<float>> hosts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    hosts.push_back(random_vector<float>(sizes[i], 40 + static_cast<uint32_t>(i), 1.5));
    double sum = 0.0;
    for (float x : hosts.back()) sum += double(x) * x;
    reference.push_back(sum);
  }
  std::vector<double> results[2];
  for (int threads : {1, 2}) {
    auto be = make_cpu_backend(threads);
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < sizes.size(); ++i) {
      tensors.push_back(upload(*be, hosts[i], {static_cast<int64_t>(sizes[i])}));
    }
    Tensor sums = upload_f64(*be, std::vector<double>(sizes.size(), -1.0));
    be->sum_squares(tensors, sums);
    std::vector<double>& out = results[threads - 1];
    out = download<double>(*be, sums);
    for (size_t i = 0; i < sizes.size(); ++i) {
      // exact squares summed in double in another order: ~n * 1e-16 relative
      EXPECT_NEAR(out[i], reference[i], 1e-12 * (1.0 + reference[i])) << i;
    }
  }
  EXPECT_EQ(results[0], results[1]);  // bit-identical across thread counts
}

TEST(TrainerOps, AdamwLeavesEverythingAsItWasWhenTheFlagSaysNonFinite) {
  auto be = make_cpu_backend(1);
  Tensor p = upload(*be, {1.0f, -2.0f}, {2}), g = upload(*be, {0.5f, NAN}, {2});
  Tensor m = upload(*be, {0.1f, 0.2f}, {2}), v = upload(*be, {0.01f, 0.04f}, {2});
  AdamWStep s;
  s.lr = 0.1f;
  s.weight_decay = 0.1f;  // would move p even with a zero gradient
  be->adamw_update(p, g, m, v, s, clip_tensor(*be, 1.0f, false));
  EXPECT_EQ(download(*be, p), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(download(*be, m), (std::vector<float>{0.1f, 0.2f}));
  EXPECT_EQ(download(*be, v), (std::vector<float>{0.01f, 0.04f}));
}

TEST(TrainerOps, GlobalNormClipGivesTheHostFormulaAndTheFiniteFlag) {
  auto be = make_cpu_backend(1);
  Tensor clip = be->allocate("clip", {2}, DType::F32, MemoryRole::Scratch);
  const std::vector<double> squares = {9.0, 0.5, 16.0, 0.25};  // norm sqrt(25.75) ~ 5.07
  Tensor sums = upload_f64(*be, squares);
  Tensor loss = upload_f64(*be, {3.5});
  double total = 0.0;
  for (double s : squares) total += s;
  // Above the limit: the trainer's float(max_norm / norm), bit for bit.
  be->global_norm_clip(sums, loss, 1.0, clip);
  EXPECT_EQ(download(*be, clip), (std::vector<float>{float(1.0 / std::sqrt(total)), 1.0f}));
  // Below the limit, and with clipping off (max_norm 0): no scaling.
  be->global_norm_clip(sums, loss, 10.0, clip);
  EXPECT_EQ(download(*be, clip), (std::vector<float>{1.0f, 1.0f}));
  be->global_norm_clip(sums, loss, 0.0, clip);
  EXPECT_EQ(download(*be, clip), (std::vector<float>{1.0f, 1.0f}));
  // A non-finite loss or squared norm clears the flag.
  Tensor nan_loss = upload_f64(*be, {NAN});
  be->global_norm_clip(sums, nan_loss, 1.0, clip);
  EXPECT_EQ(download(*be, clip)[1], 0.0f);
  Tensor inf_sums = upload_f64(*be, {1.0, INFINITY});
  be->global_norm_clip(inf_sums, loss, 1.0, clip);
  EXPECT_EQ(download(*be, clip)[1], 0.0f);
}

TEST(TrainerOps, AccumulateMeanLossAddsTheFloatMeanOfEachCall) {
  auto be = make_cpu_backend(2);
  const std::vector<float> a = {1.0f, 2.0f, 0.0f, 4.5f}, b = {0.1f, 0.2f, 0.3f, 0.0f};
  Tensor loss_sum = upload_f64(*be, {0.0});
  be->accumulate_mean_loss(upload(*be, a, {4}), 3, loss_sum);
  be->accumulate_mean_loss(upload(*be, b, {4}), 3, loss_sum);
  // Each mean: a double sum in index order, divided, rounded to float, then widened.
  auto mean = [](const std::vector<float>& x) {
    double sum = 0.0;
    for (float l : x) sum += l;
    return double(float(sum / 3.0));
  };
  EXPECT_EQ(download<double>(*be, loss_sum)[0], 0.0 + mean(a) + mean(b));
}

TEST(TrainerOps, OnlyCopyToHostAndSynchronizeCountAsSynchronisations) {
  auto be = make_cpu_backend(1);
  Tensor t = upload(*be, {1.0f, 2.0f}, {2});
  Tensor sums = be->allocate("sums", {1}, DType::F64, MemoryRole::Scratch);
  be->sum_squares({t}, sums);
  be->scale(t, 2.0f);
  EXPECT_EQ(be->sync_count(), 0);
  download(*be, t);
  be->synchronize();
  EXPECT_EQ(be->sync_count(), 2);
}

TEST(TrainerOps, ScaleMultipliesInPlace) {
  auto be = make_cpu_backend(2);
  Tensor t = upload(*be, {1.0f, -2.0f, 0.5f}, {3});
  be->scale(t, 0.25f);
  EXPECT_EQ(download(*be, t), (std::vector<float>{0.25f, -0.5f, 0.125f}));
}

TEST(TrainerOps, Bf16GemmRoundsBothInputsAndAccumulatesInFp32) {
  auto be = make_cpu_backend(2);
  const int64_t n = 33, in = 40, out = 17;
  const auto x = random_vector<float>(n * in, 50);
  const auto w = random_vector<float>(out * in, 51);
  std::vector<float> x_rounded(x), w_rounded(w);
  for (float& a : x_rounded) a = round_to_bf16(a);
  for (float& a : w_rounded) a = round_to_bf16(a);
  Tensor xt = upload(*be, x, {n, in}), wt = upload(*be, w, {out, in});
  Tensor xr = upload(*be, x_rounded, {n, in}), wr = upload(*be, w_rounded, {out, in});
  Tensor y_fp32 = be->allocate("y", {n, out}, DType::F32, MemoryRole::Scratch);
  Tensor y_rounded = be->allocate("y", {n, out}, DType::F32, MemoryRole::Scratch);
  Tensor y_bf16 = be->allocate("y", {n, out}, DType::F32, MemoryRole::Scratch);
  be->matmul_forward(xt, wt, y_fp32);
  be->matmul_forward(xr, wr, y_rounded);
  be->set_gemm_precision(GemmPrecision::BF16);
  be->matmul_forward(xt, wt, y_bf16);
  // bf16 mode is exactly an fp32 GEMM of the rounded inputs
  EXPECT_EQ(download(*be, y_bf16), download(*be, y_rounded));
  // and differs from fp32: each input carries <= 2^-9 relative error, a sum of 40 products of
  // unit normals (|y| ~ 6) moves by ~sqrt(40) * 2 * 2^-9 ~ 0.025; bound at 0.2, and demand a
  // real difference somewhere.
  const auto a = download(*be, y_fp32), b = download(*be, y_bf16);
  double max_diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 0.2);
}

TEST(TrainerOps, ParseGemmPrecisionNamesTheKeyOnError) {
  EXPECT_EQ(parse_gemm_precision("bf16"), GemmPrecision::BF16);
  EXPECT_EQ(parse_gemm_precision("fp32"), GemmPrecision::FP32);
  try {
    parse_gemm_precision("fp16");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("train.gemm_precision"), std::string::npos);
  }
}

TEST(TrainerOps, AllocationIsCountedAndZeroed) {
  auto be = make_cpu_backend(1);
  EXPECT_EQ(be->allocated_bytes(), 0u);
  Tensor t = be->allocate("x", {10, 10}, DType::F32, MemoryRole::Scratch);
  EXPECT_GE(be->allocated_bytes(), 400u);
  EXPECT_GE(be->peak_allocated_bytes(), be->allocated_bytes());
  EXPECT_EQ(download(*be, t), std::vector<float>(100, 0.0f));
  Tensor view = tensor_view(t, {5, 2}, 90);
  EXPECT_EQ(static_cast<char*>(view.data) - static_cast<char*>(t.data), 360);
  EXPECT_THROW(tensor_view(t, {5, 3}, 90), Error);
  EXPECT_THROW(tensor_view(t, {-5}, 10), Error);  // numel -5 would pass the bound
}

TEST(TrainerOps, AllocationIsCountedByRole) {
  auto be = make_cpu_backend(1);
  be->allocate("w", {256}, DType::F32, MemoryRole::Weights);
  be->allocate("m", {64}, DType::F32, MemoryRole::OptimizerState);
  be->allocate("codes", {1000}, DType::U8, MemoryRole::SavedActivations);
  const MemoryUse use = be->memory_use();
  EXPECT_EQ(use[MemoryRole::Weights], 1024u);
  EXPECT_EQ(use[MemoryRole::OptimizerState], 256u);
  EXPECT_EQ(use[MemoryRole::SavedActivations], 1024u);  // rounded up to 64-byte blocks
  EXPECT_EQ(use[MemoryRole::Gradients], 0u);
  EXPECT_EQ(use.total(), be->allocated_bytes());
  EXPECT_STREQ(memory_role_name(MemoryRole::SavedActivations), "saved_activations");
}

TEST(TrainerOps, AttentionBackwardIsBitIdenticalAcrossRuns) {
  auto be = make_cpu_backend(2);
  const int64_t b = 2, t = 80, h = 4, hkv = 2, hd = 8;
  Tensor q = upload(*be, random_vector<float>(b * t * h * hd, 60), {b, t, h, hd});
  Tensor k = upload(*be, random_vector<float>(b * t * hkv * hd, 61), {b, t, hkv, hd});
  Tensor v = upload(*be, random_vector<float>(b * t * hkv * hd, 62), {b, t, hkv, hd});
  Tensor dout = upload(*be, random_vector<float>(b * t * h * hd, 63), {b, t, h, hd});
  Tensor out = be->allocate("out", {b, t, h, hd}, DType::F32, MemoryRole::Scratch);
  std::unique_ptr<AttentionState> saved =
      be->plan_attention("attention", {b, t, h, hkv, hd}, false);
  Tensor dq = be->allocate("dq", {b, t, h, hd}, DType::F32, MemoryRole::Scratch);
  Tensor dk = be->allocate("dk", {b, t, hkv, hd}, DType::F32, MemoryRole::Scratch);
  Tensor dv = be->allocate("dv", {b, t, hkv, hd}, DType::F32, MemoryRole::Scratch);
  std::vector<float> first[3];
  for (int run = 0; run < 2; ++run) {
    be->attention_forward(q, k, v, out, *saved);
    be->attention_backward(q, k, v, *saved, dout, dq, dk, dv);
    const std::vector<float> got[3] = {download(*be, dq), download(*be, dk), download(*be, dv)};
    for (int i = 0; i < 3; ++i) {
      if (run == 0)
        first[i] = got[i];
      else
        EXPECT_EQ(first[i], got[i]);
    }
  }
}

// The poison debug mode (make_cpu_backend): what nothing may read unwritten starts as NaN
// bytes; what the model relies on being zero stays zero.
TEST(PoisonMode, FillsActivationsSavedAndScratchWithNanAndLeavesTheRestZero) {
  auto backend = make_cpu_backend(1, /*poison=*/true);
  for (int r = 0; r < kMemoryRoles; ++r) {
    const MemoryRole role = static_cast<MemoryRole>(r);
    Tensor t = backend->allocate("t", {5}, DType::F32, role);
    std::vector<float> host(5, 1.0f);
    backend->copy_to_host(t, host.data());
    const bool poisoned = role == MemoryRole::Activations || role == MemoryRole::SavedActivations ||
                          role == MemoryRole::Scratch;
    for (float v : host) {
      if (poisoned) {
        EXPECT_TRUE(std::isnan(v)) << memory_role_name(role);
      } else {
        EXPECT_EQ(v, 0.0f) << memory_role_name(role);
      }
    }
  }
  auto clean = make_cpu_backend(1);
  Tensor t = clean->allocate("t", {3}, DType::F32, MemoryRole::Scratch);
  std::vector<float> host(3, 1.0f);
  clean->copy_to_host(t, host.data());
  EXPECT_EQ(host, std::vector<float>(3, 0.0f));
}

}  // namespace
}  // namespace gnmr
