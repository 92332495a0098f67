// Every CPU op's backward against central differences of its forward, run in double
// (the ops are templates instantiated for float and double), so tolerances can be tight.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/gradient_check.h"
#include "backend/rope_table.h"

namespace gnmr {
namespace {

using testing::dot;
using testing::expect_matches_central_differences;
using testing::random_vector;

// Double path, O(1) values, h = 1e-6: truncation ~1e-12 and rounding ~1e-10 (see
// gradient_check.h), so 1e-6 relative leaves four orders of margin and still catches any
// wrong term (a wrong term is O(1)).
constexpr double kTolerance = 1e-6;
constexpr int kThreads = 2;    // the analytic gradients: exercises the parallel paths
constexpr int kFdThreads = 1;  // the thousands of forward calls of a difference check

TEST(OpGradients, MatmulBackwardMatchesFiniteDifferencesAndAccumulatesWeightGradient) {
  const int64_t n = 5, in = 7, out = 3;
  auto x = random_vector<double>(n * in, 1);
  auto w = random_vector<double>(out * in, 2);
  const auto r = random_vector<double>(n * out, 3);
  std::vector<double> y(n * out);
  auto loss = [&] {
    cpu::matmul_forward(x.data(), w.data(), y.data(), n, in, out, kFdThreads);
    return dot(r, y);
  };
  std::vector<double> dx(n * in, 0.0);
  const auto dw_before = random_vector<double>(out * in, 4);
  std::vector<double> dw = dw_before;
  cpu::matmul_backward_input(r.data(), w.data(), dx.data(), n, in, out, false, kThreads);
  cpu::matmul_backward_weight(x.data(), r.data(), dw.data(), n, in, out, kThreads);
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw_before[i];  // it accumulated
  expect_matches_central_differences(x, dx, loss, kTolerance, "dx");
  expect_matches_central_differences(w, dw, loss, kTolerance, "dw");

  // accumulate = true adds to what dx held
  std::vector<double> dx_acc(n * in, 1.0);
  cpu::matmul_backward_input(r.data(), w.data(), dx_acc.data(), n, in, out, true, kThreads);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx_acc[i], dx[i] + 1.0, 1e-12);
}

// The row split gives every row the product the single call gives, to within the rounding of
// one k-sum: not always the same bits, because OpenBLAS's kernels tile rows (Haswell/Zen's
// sgemm computes a tile's last rows in another order), so where a block starts moves rows
// between tiles. A run's bits therefore depend on its thread count on such a kernel (README "Same
// bits, same settings"); the reductions that are persisted do not (docs/DESIGN.md §8).
TEST(OpGradients, GemmParallelSplitsRowsToWithinOneSumsRounding) {
  const int64_t m = 1024, n = 256, k = 512;  // a training shape: split on both kernels' tiles
  const auto a = random_vector<float>(m * k, 5);
  const auto b = random_vector<float>(n * k, 6);
  std::vector<float> one(m * n), four(m * n);
  cpu::gemm_parallel<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, one.data(),
                            n, 1);
  cpu::gemm_parallel<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, four.data(),
                            n, 4);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      // |sum| <= sum |a_l b_l|; two summation orders differ by at most k ulp-scale errors each.
      double magnitude = 0;
      for (int64_t l = 0; l < k; ++l) magnitude += std::fabs(double(a[i * k + l]) * b[j * k + l]);
      ASSERT_NEAR(one[i * n + j], four[i * n + j], 2.0 * k * 6e-8 * magnitude)
          << "row " << i << " column " << j;
    }
  }
}

TEST(OpGradients, RmsnormBackwardMatchesFiniteDifferences) {
  // 70 rows: more than two partial-sum chunks of dw (kRmsnormChunkRows = 32).
  const int64_t n = 70, d = 8;
  const double eps = 1e-5;
  auto x = random_vector<double>(n * d, 7);
  auto w = random_vector<double>(d, 8);
  const auto r = random_vector<double>(n * d, 9);
  std::vector<double> y(n * d), rstd(n);
  auto loss = [&] {
    cpu::rmsnorm_forward(x.data(), w.data(), eps, y.data(), rstd.data(), n, d, kFdThreads);
    return dot(r, y);
  };
  loss();
  std::vector<double> dx(n * d, 0.5), dw(d, 0.25);  // both accumulate
  std::vector<double> ws(cpu::rmsnorm_backward_workspace(n, d));
  cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), r.data(), dx.data(), dw.data(), n, d,
                        ws.data(), kThreads);
  for (double& v : dx) v -= 0.5;
  for (double& v : dw) v -= 0.25;
  expect_matches_central_differences(x, dx, loss, kTolerance, "dx");
  expect_matches_central_differences(w, dw, loss, kTolerance, "dw");
}

TEST(OpGradients, RopeBackwardMatchesFiniteDifferences) {
  const int64_t b = 2, t = 6, heads = 3, hd = 8;
  std::vector<float> cos, sin;
  compute_rope_table(10000.0f, hd, t, cos, sin);
  auto x = random_vector<double>(b * t * heads * hd, 10);
  const auto r = random_vector<double>(x.size(), 11);
  auto loss = [&] {
    std::vector<double> y = x;
    cpu::rope_forward(y.data(), cos.data(), sin.data(), b, t, heads, hd, kFdThreads);
    return dot(r, y);
  };
  std::vector<double> dx = r;
  cpu::rope_backward(dx.data(), cos.data(), sin.data(), b, t, heads, hd, kThreads);
  expect_matches_central_differences(x, dx, loss, kTolerance, "dx");
}

void check_attention_gradients(const cpu::AttentionShape& s) {
  const int64_t q_size = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_size = s.batch * s.seq * s.kv_heads * s.head_dim;
  auto q = random_vector<double>(q_size, 12);
  auto k = random_vector<double>(kv_size, 13);
  auto v = random_vector<double>(kv_size, 14);
  const auto r = random_vector<double>(q_size, 15);
  std::vector<double> out(q_size), probs(s.batch * s.heads * s.seq * s.seq);
  auto loss = [&] {
    cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, kFdThreads);
    return dot(r, out);
  };
  loss();
  // Poison the outputs: the backward must overwrite them, not accumulate.
  std::vector<double> dq(q_size, 7.0), dk(kv_size, 7.0), dv(kv_size, 7.0);
  std::vector<double> ws(cpu::attention_backward_workspace(s, kThreads));
  cpu::attention_backward(q.data(), k.data(), v.data(), probs.data(), r.data(), dq.data(),
                          dk.data(), dv.data(), s, ws.data(), kThreads);
  expect_matches_central_differences(q, dq, loss, kTolerance, "dq");
  expect_matches_central_differences(k, dk, loss, kTolerance, "dk");
  expect_matches_central_differences(v, dv, loss, kTolerance, "dv");
}

TEST(OpGradients, AttentionBackwardMatchesFiniteDifferencesWithGroupedQueryHeads) {
  check_attention_gradients({/*batch=*/2, /*seq=*/5, /*heads=*/4, /*kv_heads=*/2, /*hd=*/4});
}

TEST(OpGradients, AttentionBackwardMatchesFiniteDifferencesAcrossGemmBlocks) {
  // seq 70 > the 64-row GEMM block, so the off-diagonal block paths run.
  check_attention_gradients({/*batch=*/1, /*seq=*/70, /*heads=*/2, /*kv_heads=*/1, /*hd=*/2});
}

TEST(OpGradients, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t count = 40;
  auto gate = random_vector<double>(count, 16, 2.0);
  auto up = random_vector<double>(count, 17);
  const auto r = random_vector<double>(count, 18);
  std::vector<double> out(count);
  auto loss = [&] {
    cpu::swiglu_forward(gate.data(), up.data(), out.data(), count, kFdThreads);
    return dot(r, out);
  };
  std::vector<double> dgate(count), dup(count);
  cpu::swiglu_backward(gate.data(), up.data(), r.data(), dgate.data(), dup.data(), count, kThreads);
  expect_matches_central_differences(gate, dgate, loss, kTolerance, "dgate");
  expect_matches_central_differences(up, dup, loss, kTolerance, "dup");
}

TEST(OpGradients, EmbeddingBackwardMatchesFiniteDifferencesWithRepeatedTokens) {
  const int64_t vocab = 6, d = 40, n = 9;
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 5, 3, 1, 2, 3};
  auto table = random_vector<double>(vocab * d, 19);
  const auto r = random_vector<double>(n * d, 20);
  std::vector<double> out(n * d);
  auto loss = [&] {
    cpu::embedding_forward(tokens.data(), table.data(), out.data(), n, d, kFdThreads);
    return dot(r, out);
  };
  std::vector<double> dtable(vocab * d, 0.0);
  cpu::embedding_backward(tokens.data(), r.data(), dtable.data(), n, d, kThreads);
  expect_matches_central_differences(table, dtable, loss, kTolerance, "dtable");
}

TEST(OpGradients, CrossEntropyGradientMatchesFiniteDifferencesAndIgnoresNegativeTargets) {
  const int64_t n = 4, vocab = 11;
  const std::vector<int32_t> targets = {3, -1, 0, 10};
  auto logits = random_vector<double>(n * vocab, 21, 3.0);
  const double dloss = 0.37;
  std::vector<double> losses(n);
  auto loss = [&] {
    cpu::cross_entropy_forward(logits.data(), targets.data(), losses.data(), n, vocab, kFdThreads);
    double sum = 0.0;
    for (double l : losses) sum += dloss * l;
    return sum;
  };
  const double forward_sum = loss();
  std::vector<double> grad = logits;
  std::vector<double> fused_losses(n);
  cpu::cross_entropy_forward_backward(grad.data(), targets.data(), fused_losses.data(), dloss, n,
                                      vocab, kThreads);
  EXPECT_EQ(fused_losses[1], 0.0);
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(grad[1 * vocab + j], 0.0);
  double fused_sum = 0.0;
  for (double l : fused_losses) fused_sum += dloss * l;
  EXPECT_NEAR(fused_sum, forward_sum, 1e-12);  // the two passes compute the same loss
  expect_matches_central_differences(logits, grad, loss, kTolerance, "dlogits");
}

// A NaN logit must surface: the loss and the whole gradient row are NaN (the vectorizable exp
// once clamped NaN to e^88, which turned a NaN row into a finite loss of about 88).
TEST(OpGradients, CrossEntropyOfANanLogitIsNanInTheLossAndTheGradient) {
  const int64_t n = 2, vocab = 37;
  std::vector<float> logits = random_vector<float>(n * vocab, 22, 3.0f);
  logits[5] = std::numeric_limits<float>::quiet_NaN();  // row 0; row 1 stays finite
  const std::vector<int32_t> targets = {3, 4};
  std::vector<float> losses(n), fused_losses(n), grad = logits;
  cpu::cross_entropy_forward(logits.data(), targets.data(), losses.data(), n, vocab, kThreads);
  cpu::cross_entropy_forward_backward(grad.data(), targets.data(), fused_losses.data(), 1.0f, n,
                                      vocab, kThreads);
  EXPECT_TRUE(std::isnan(losses[0]));
  EXPECT_TRUE(std::isnan(fused_losses[0]));
  for (int64_t j = 0; j < vocab; ++j) EXPECT_TRUE(std::isnan(grad[size_t(j)])) << j;
  EXPECT_TRUE(std::isfinite(losses[1]));
  EXPECT_EQ(fused_losses[1], losses[1]);
}

}  // namespace
}  // namespace gnmr
