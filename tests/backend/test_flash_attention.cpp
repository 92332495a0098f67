// Flash attention's tiling rules (shared with the GPU kernel) for every sequence length, and
// its CPU twin against the materialised attention the CPU backend runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/flash_attention.h"
#include "backend/cpu/ops.h"
#include "backend/flash_tiling.h"

namespace gnmr {
namespace {

TEST(FlashTiling, TheTilesCoverTheCausalTriangleExactlyOnce) {
  for (auto [qt, kt] : {std::pair<int64_t, int64_t>{64, 64}, {128, 64}, {64, 128}, {16, 48}}) {
    for (int64_t seq = 1; seq <= 300; ++seq) {
      SCOPED_TRACE(::testing::Message() << "tiles " << qt << "x" << kt << " seq " << seq);
      const FlashTiling t{seq, qt, kt};
      std::vector<int> covered(size_t(seq * seq), 0);
      std::vector<std::pair<int64_t, int64_t>> from_q, from_kv;
      for (int64_t qi = 0; qi < flash_q_tiles(t); ++qi) {
        for (int64_t kj = 0; kj <= flash_last_kv_tile(t, qi); ++kj) {
          from_q.push_back({qi, kj});
          bool any_visible = false, any_masked = false;
          for (int64_t i = qi * qt; i < qi * qt + flash_tile_rows(qi, qt, seq); ++i) {
            for (int64_t j = kj * kt; j < kj * kt + flash_tile_rows(kj, kt, seq); ++j) {
              if (j <= i) {
                ++covered[size_t(i * seq + j)];
                any_visible = true;
              } else {
                any_masked = true;
              }
            }
          }
          EXPECT_TRUE(any_visible) << "a tile pair with nothing to compute: " << qi << "," << kj;
          EXPECT_EQ(flash_tile_is_masked(t, qi, kj), any_masked) << qi << "," << kj;
        }
      }
      for (int64_t i = 0; i < seq; ++i)
        for (int64_t j = 0; j <= i; ++j)
          ASSERT_EQ(covered[size_t(i * seq + j)], 1) << i << "," << j;
      // The key-side enumeration (the backward's pass 1) finds the same pairs.
      for (int64_t kj = 0; kj < flash_kv_tiles(t); ++kj)
        for (int64_t qi = flash_first_q_tile(t, kj); qi < flash_q_tiles(t); ++qi)
          from_kv.push_back({qi, kj});
      std::sort(from_q.begin(), from_q.end());
      std::sort(from_kv.begin(), from_kv.end());
      EXPECT_EQ(from_q, from_kv);
    }
  }
}

// The tensor-core kernels skip the mask on a pair flash_tile_needs_mask clears: then every one
// of the pair's q_tile x kv_tile scores, the zero rows of a partial tile included, must be a
// real query and a real key at or before it. And a pair it marks must hold one that is not
// (otherwise the check costs the kernels time for nothing).
TEST(FlashTiling, TheUnmaskedTilePairsHoldOnlyRealVisibleScores) {
  for (auto [qt, kt] : {std::pair<int64_t, int64_t>{64, 64}, {128, 64}, {64, 128}, {16, 48}}) {
    int64_t unmasked_pairs = 0;
    for (int64_t seq = 1; seq <= 300; ++seq) {
      SCOPED_TRACE(::testing::Message() << "tiles " << qt << "x" << kt << " seq " << seq);
      const FlashTiling t{seq, qt, kt};
      for (int64_t qi = 0; qi < flash_q_tiles(t); ++qi) {
        for (int64_t kj = 0; kj <= flash_last_kv_tile(t, qi); ++kj) {
          bool all_real_and_visible = true;
          for (int64_t i = qi * qt; i < (qi + 1) * qt; ++i) {
            for (int64_t j = kj * kt; j < (kj + 1) * kt; ++j) {
              all_real_and_visible = all_real_and_visible && i < seq && j < seq && j <= i;
            }
          }
          EXPECT_EQ(flash_tile_needs_mask(t, qi, kj), !all_real_and_visible) << qi << "," << kj;
          unmasked_pairs += !flash_tile_needs_mask(t, qi, kj);
        }
      }
    }
    EXPECT_GT(unmasked_pairs, 0);
  }
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);  // never zeros
  return x;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

TEST(FlashAttentionCpu, ForwardAndBackwardEqualTheMaterialisedAttention) {
  for (int64_t seq : {1, 17, 128, 200}) {
    SCOPED_TRACE(::testing::Message() << "seq " << seq);
    const cpu::AttentionShape s{2, seq, 4, 2, 16};  // GQA: 2 query heads per kv head
    const size_t nq = size_t(s.batch * seq * s.heads * s.head_dim);
    const size_t nkv = size_t(s.batch * seq * s.kv_heads * s.head_dim);
    const std::vector<float> q = random_vector(nq, 1), k = random_vector(nkv, 2),
                             v = random_vector(nkv, 3), dout = random_vector(nq, 4);

    std::vector<float> out(nq), probs(size_t(s.batch * s.heads * seq * seq));
    cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, 2);
    std::vector<float> dq(nq), dk(nkv), dv(nkv);
    std::vector<float> ws(size_t(cpu::attention_backward_workspace(s, 2)));
    cpu::attention_backward(q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), s, ws.data(), 2);

    const FlashTiling tiles{seq, 64, 32};  // unequal tiles: the masked pairs are not diagonal
    std::vector<float> f_out(nq, NAN), lse(size_t(s.batch * s.heads * seq), NAN);
    cpu::flash_attention_forward(q.data(), k.data(), v.data(), f_out.data(), lse.data(), s, tiles,
                                 2);
    std::vector<float> f_dq(nq, NAN), f_dk(nkv, NAN), f_dv(nkv, NAN);
    cpu::flash_attention_backward(q.data(), k.data(), v.data(), f_out.data(), lse.data(),
                                  dout.data(), f_dq.data(), f_dk.data(), f_dv.data(), s, tiles, 2);

    // Outputs are convex combinations of unit-normal values: fp32 rounding over <= 200 terms.
    EXPECT_LT(max_abs_difference(f_out, out), 1e-5);
    // The log-sum-exp of each row, from the scores in double.
    const double scale = 1.0 / std::sqrt(double(s.head_dim));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < seq; ++i) {
          double m = -INFINITY, sum = 0;
          std::vector<double> scores;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < s.head_dim; ++d)
              dot += double(q[size_t(((b * seq + i) * s.heads + h) * s.head_dim + d)]) *
                     k[size_t(((b * seq + j) * s.kv_heads + h / 2) * s.head_dim + d)];
            scores.push_back(dot * scale);
            m = std::max(m, dot * scale);
          }
          for (double x : scores) sum += std::exp(x - m);
          EXPECT_NEAR(lse[size_t((b * s.heads + h) * seq + i)], m + std::log(sum), 1e-5);
        }
    // Gradients sum up to T * group products of O(1) terms.
    EXPECT_LT(max_abs_difference(f_dq, dq), 1e-4);
    EXPECT_LT(max_abs_difference(f_dk, dk), 1e-4);
    EXPECT_LT(max_abs_difference(f_dv, dv), 1e-4);
  }
}

}  // namespace
}  // namespace gnmr
