// The v1 CUDA attention's plan (backend/cuda/attention_v1_plan.h) executed on the host: a plain
// loop implementation of cuBLASLt's strided-batched column-major GEMM (D = alpha op(A) op(B) +
// beta C, C not read when beta = 0) and of the two softmax kernels, walking the plan's steps in
// order, in double, must reproduce cpu::attention_forward / attention_backward<double>. This
// proves every m/n/k, transpose, leading dimension, batch stride, offset and the GQA head
// mapping and accumulation order without a GPU; what is left for the GPU is cuBLASLt honouring
// its documented definition and the kernels' parallel reductions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_v1_plan.h"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

using Buffers = std::vector<std::vector<double>*>;  // by AttentionTensor

// cuBLASLt's definition, read through the plan's layouts. .at() bounds-checks every access, so a
// stride or offset that leaves its tensor fails the test instead of reading a neighbour.
void host_strided_batched_gemm(const AttentionGemmPlan& g, const AttentionGemmCall& c,
                               const Buffers& buf) {
  const std::vector<double>& a = *buf[size_t(g.a.tensor)];
  const std::vector<double>& b = *buf[size_t(g.b.tensor)];
  std::vector<double>& d = *buf[size_t(g.d.tensor)];
  // op(A) is m x k, op(B) k x n, D m x n; each leading dimension covers its rows.
  ASSERT_EQ(g.transa ? g.a.cols : g.a.rows, g.m);
  ASSERT_EQ(g.transa ? g.a.rows : g.a.cols, g.k);
  ASSERT_EQ(g.transb ? g.b.cols : g.b.rows, g.k);
  ASSERT_EQ(g.transb ? g.b.rows : g.b.cols, g.n);
  ASSERT_EQ(g.d.rows, g.m);
  ASSERT_EQ(g.d.cols, g.n);
  ASSERT_GE(g.a.ld, g.a.rows);
  ASSERT_GE(g.b.ld, g.b.rows);
  ASSERT_GE(g.d.ld, g.d.rows);
  for (int64_t i = 0; i < g.batch_count; ++i) {
    const int64_t a0 = c.a_offset + i * g.a.batch_stride;
    const int64_t b0 = c.b_offset + i * g.b.batch_stride;
    const int64_t d0 = c.d_offset + i * g.d.batch_stride;
    for (int64_t col = 0; col < g.n; ++col) {
      for (int64_t row = 0; row < g.m; ++row) {
        double sum = 0.0;
        for (int64_t l = 0; l < g.k; ++l) {
          const double op_a =
              g.transa ? a.at(size_t(a0 + l + row * g.a.ld)) : a.at(size_t(a0 + row + l * g.a.ld));
          const double op_b =
              g.transb ? b.at(size_t(b0 + col + l * g.b.ld)) : b.at(size_t(b0 + l + col * g.b.ld));
          sum += op_a * op_b;
        }
        double& out = d.at(size_t(d0 + row + col * g.d.ld));
        out = double(g.alpha) * sum + (c.beta != 0.0f ? double(c.beta) * out : 0.0);
      }
    }
  }
}

// The kernels' arithmetic (kernels/causal_softmax.cu) as a plain loop.
void host_softmax_forward(double* p, int64_t matrices, int64_t t) {
  for (int64_t row = 0; row < matrices * t; ++row) {
    const int64_t i = row % t;
    double* r = p + row * t;
    double max_score = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= i; ++j) max_score = std::max(max_score, r[j]);
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += r[j] = std::exp(r[j] - max_score);
    for (int64_t j = 0; j < t; ++j) r[j] = j <= i ? r[j] * (1.0 / sum) : 0.0;
  }
}

void host_softmax_backward(const double* p, double* ds, int64_t matrices, int64_t t, double scale) {
  for (int64_t row = 0; row < matrices * t; ++row) {
    const int64_t i = row % t;
    const double* pr = p + row * t;
    double* dr = ds + row * t;
    double dot = 0.0;
    for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
    for (int64_t j = 0; j < t; ++j) dr[j] = j <= i ? scale * pr[j] * (dr[j] - dot) : 0.0;
  }
}

void run_steps(const AttentionPlan& plan, const std::vector<AttentionStep>& steps,
               const Buffers& buf) {
  const int64_t t = plan.shape.seq;
  for (const AttentionStep& step : steps) {
    switch (step.kind) {
      case AttentionStepKind::kGemm:
        host_strided_batched_gemm(plan.gemms.at(size_t(step.gemm)), step.call, buf);
        break;
      case AttentionStepKind::kSoftmaxForward:
        ASSERT_LE(step.probs_offset + step.matrices * t * t,
                  int64_t(buf[size_t(AttentionTensor::kProbs)]->size()));
        host_softmax_forward(buf[size_t(AttentionTensor::kProbs)]->data() + step.probs_offset,
                             step.matrices, t);
        break;
      case AttentionStepKind::kSoftmaxBackward:
        ASSERT_LE(step.probs_offset + step.matrices * t * t,
                  int64_t(buf[size_t(AttentionTensor::kProbs)]->size()));
        ASSERT_LE(step.dscores_offset + step.matrices * t * t,
                  int64_t(buf[size_t(AttentionTensor::kDScores)]->size()));
        host_softmax_backward(buf[size_t(AttentionTensor::kProbs)]->data() + step.probs_offset,
                              buf[size_t(AttentionTensor::kDScores)]->data() + step.dscores_offset,
                              step.matrices, t, plan.scale);
        break;
    }
  }
}

std::vector<double> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(n);
  for (double& v : x) v = u(rng);
  return x;
}

// NaN, so a value the plan never writes survives into the comparison and fails it.
std::vector<double> poisoned(size_t n) {
  return std::vector<double>(n, std::numeric_limits<double>::quiet_NaN());
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    // Both sides are double with the same products; only the summation order differs, over at
    // most T = 17 terms of size ~1: 1e-12 is ~4500 ulp of headroom, and any index error is O(1).
    ASSERT_NEAR(got[i], want[i], 1e-12 * (1.0 + std::abs(want[i]))) << what << " at " << i;
  }
}

void expect_plan_matches_cpu(const AttentionShape& s) {
  SCOPED_TRACE("B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
               " H=" + std::to_string(s.heads) + " Hkv=" + std::to_string(s.kv_heads) +
               " hd=" + std::to_string(s.head_dim));
  const size_t nq = size_t(s.batch * s.seq * s.heads * s.head_dim);
  const size_t nkv = size_t(s.batch * s.seq * s.kv_heads * s.head_dim);
  const size_t np = size_t(s.batch * s.heads * s.seq * s.seq);
  std::vector<double> q = random_values(nq, 1), k = random_values(nkv, 2),
                      v = random_values(nkv, 3), dout = random_values(nq, 4);

  std::vector<double> want_out(nq), want_probs(np), want_dq(nq), want_dk(nkv), want_dv(nkv);
  cpu::attention_forward<double>(q.data(), k.data(), v.data(), want_out.data(), want_probs.data(),
                                 s, 1);
  std::vector<double> workspace(size_t(cpu::attention_backward_workspace(s, 1)));
  cpu::attention_backward<double>(q.data(), k.data(), v.data(), want_probs.data(), dout.data(),
                                  want_dq.data(), want_dk.data(), want_dv.data(), s,
                                  workspace.data(), 1);

  const AttentionPlan plan = plan_attention_v1(s);
  std::vector<double> out = poisoned(nq), probs = poisoned(np), dq = poisoned(nq),
                      dk = poisoned(nkv), dv = poisoned(nkv),
                      dscores = poisoned(size_t(attention_v1_backward_scratch_floats(s)));
  Buffers buf(10, nullptr);
  buf[size_t(AttentionTensor::kQ)] = &q;
  buf[size_t(AttentionTensor::kK)] = &k;
  buf[size_t(AttentionTensor::kV)] = &v;
  buf[size_t(AttentionTensor::kOut)] = &out;
  buf[size_t(AttentionTensor::kProbs)] = &probs;
  buf[size_t(AttentionTensor::kDOut)] = &dout;
  buf[size_t(AttentionTensor::kDScores)] = &dscores;
  buf[size_t(AttentionTensor::kDq)] = &dq;
  buf[size_t(AttentionTensor::kDk)] = &dk;
  buf[size_t(AttentionTensor::kDv)] = &dv;
  run_steps(plan, plan.forward, buf);
  expect_near_all(probs, want_probs, "probs");
  expect_near_all(out, want_out, "out");
  run_steps(plan, plan.backward, buf);
  expect_near_all(dq, want_dq, "dq");
  expect_near_all(dk, want_dk, "dk");
  expect_near_all(dv, want_dv, "dv");
}

// Head dims are powers of 4 here: the plan's scale is the CPU<float>'s 1 / sqrt(hd) in float,
// the CPU<double>'s is a double, and only for hd = 4^n are both exact, so the comparison sees
// the index rules alone (hd = 8 would differ by float's rounding of 1 / sqrt(8), ~1e-8).
TEST(AttentionV1Plan, ReproducesCpuAttentionWithGroupedQueryHeads) {
  expect_plan_matches_cpu({2, 17, 6, 2, 16});  // group 3
}

TEST(AttentionV1Plan, ReproducesCpuAttentionWithOneKvHeadPerQueryHead) {
  expect_plan_matches_cpu({2, 17, 4, 4, 16});
}

TEST(AttentionV1Plan, ReproducesCpuAttentionWithOneSharedKvHeadAndShortSequences) {
  expect_plan_matches_cpu({2, 5, 4, 1, 4});
  expect_plan_matches_cpu({2, 1, 4, 2, 16});  // T = 1: each row keeps its own key only
}

TEST(AttentionV1Plan, RunsBatchTimesGroupCallsPerGemmInAFixedAccumulationOrder) {
  const AttentionShape s{3, 17, 8, 2, 8};
  const AttentionPlan plan = plan_attention_v1(s);
  const int64_t group = 4;
  EXPECT_EQ(int64_t(plan.forward.size()), 2 * s.batch * group + 1);
  EXPECT_EQ(int64_t(plan.backward.size()), s.batch * (4 * group + 1));
  for (const AttentionGemmPlan& g : plan.gemms) EXPECT_EQ(g.batch_count, s.kv_heads);
  // dk and dv: per batch, g runs 0, 1, ..., group - 1 with beta 0 exactly for g = 0.
  std::vector<int64_t> next_g(size_t(s.batch), 0);
  for (const AttentionStep& step : plan.backward) {
    if (step.kind != AttentionStepKind::kGemm || step.gemm != int(AttentionGemm::kDk)) continue;
    EXPECT_EQ(step.call.group_index, next_g[size_t(step.call.batch)]++);
    EXPECT_EQ(step.call.beta, step.call.group_index == 0 ? 0.0f : 1.0f);
  }
  for (int64_t n : next_g) EXPECT_EQ(n, group);
  EXPECT_EQ(plan.scale, 1.0f / std::sqrt(8.0f));
}

TEST(AttentionV1Plan, RejectsHeadsThatAreNotAMultipleOfKvHeads) {
  EXPECT_THROW(plan_attention_v1({2, 17, 6, 4, 8}), Error);
  EXPECT_THROW(plan_attention_v1({2, 0, 4, 4, 8}), Error);
}

}  // namespace
}  // namespace gnmr::cuda
