// The float CPU backend's rope, attention (with GQA) and rmsnorm forward against naive
// double implementations written straight from the Hugging Face formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/gradient_check.h"
#include "backend/rope_table.h"
#include "backend_tensors.h"

namespace gnmr {
namespace {

using testing::download;
using testing::upload;

using testing::random_vector;

// HF: q_embed = q * cos + rotate_half(q) * sin, cos = cat(cos(freqs), cos(freqs)),
// rotate_half(x) = cat(-x2, x1); freqs[t, i] = t / theta^(2i / hd). Here in double.
std::vector<double> reference_rope(const std::vector<float>& x, int64_t b, int64_t t, int64_t heads,
                                   int64_t hd, double theta) {
  std::vector<double> y(x.size());
  const int64_t half = hd / 2;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t pos = 0; pos < t; ++pos)
      for (int64_t h = 0; h < heads; ++h) {
        const float* xr = x.data() + ((bi * t + pos) * heads + h) * hd;
        double* yr = y.data() + ((bi * t + pos) * heads + h) * hd;
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t f = i % half;
          const double angle = pos / std::pow(theta, 2.0 * f / hd);
          const double rotated = i < half ? -double(xr[i + half]) : double(xr[i - half]);
          yr[i] = xr[i] * std::cos(angle) + rotated * std::sin(angle);
        }
      }
  return y;
}

TEST(ForwardReference, RopeMatchesHuggingFaceRotateHalf) {
  auto be = make_cpu_backend(2);
  const int64_t b = 2, t = 16, heads = 3, hd = 8;
  const float theta = 10000.0f;
  std::vector<float> cos, sin;
  compute_rope_table(theta, hd, t, cos, sin);
  Tensor cos_t = upload(*be, cos, {t, hd / 2}), sin_t = upload(*be, sin, {t, hd / 2});
  const auto x = random_vector<float>(b * t * heads * hd, 30);
  Tensor xt = upload(*be, x, {b, t, heads, hd});
  be->rope_forward(xt, cos_t, sin_t);
  const auto got = download(*be, xt);
  const auto want = reference_rope(x, b, t, heads, hd, theta);
  // fp32 angles t * inv_freq (t < 16) carry ~16 * 6e-8 absolute error, cos/sin and the
  // products ~1e-7 relative, values O(1): 1e-5 absolute is 10x that.
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;

  // backward = inverse rotation: rope_backward(rope_forward(x)) == x
  be->rope_backward(xt, cos_t, sin_t);
  const auto back = download(*be, xt);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(back[i], x[i], 1e-6) << i;
  }
}

// softmax(q k^T / sqrt(hd) + causal mask) v with k, v repeated per group (HF repeat_kv).
std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t b, int64_t t,
                                        int64_t h, int64_t hkv, int64_t hd) {
  std::vector<double> out(q.size(), 0.0);
  const int64_t rep = h / hkv;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t head = 0; head < h; ++head) {
      const int64_t kvh = head / rep;
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> score(t, -INFINITY);
        double max_score = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < hd; ++c)
            s += double(q[((bi * t + i) * h + head) * hd + c]) *
                 k[((bi * t + j) * hkv + kvh) * hd + c];
          score[j] = s / std::sqrt(double(hd));
          max_score = std::max(max_score, score[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(score[j] - max_score);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(score[j] - max_score) / sum;
          for (int64_t c = 0; c < hd; ++c)
            out[((bi * t + i) * h + head) * hd + c] += p * v[((bi * t + j) * hkv + kvh) * hd + c];
        }
      }
    }
  return out;
}

void check_attention_against_reference(int64_t b, int64_t t, int64_t h, int64_t hkv, int64_t hd) {
  auto be = make_cpu_backend(2);
  const auto q = random_vector<float>(b * t * h * hd, 31);
  const auto k = random_vector<float>(b * t * hkv * hd, 32);
  const auto v = random_vector<float>(b * t * hkv * hd, 33);
  Tensor qt = upload(*be, q, {b, t, h, hd}), kt = upload(*be, k, {b, t, hkv, hd});
  Tensor vt = upload(*be, v, {b, t, hkv, hd});
  Tensor out = be->allocate("out", {b, t, h, hd}, DType::F32, MemoryRole::Scratch);
  std::unique_ptr<AttentionState> saved =
      be->plan_attention("attention", {b, t, h, hkv, hd}, false);
  be->attention_forward(qt, kt, vt, out, *saved);
  const auto got = download(*be, out);
  const auto want = reference_attention(q, k, v, b, t, h, hkv, hd);
  // fp32 dot products of length hd and t with O(1) terms: ~sqrt(t) * 6e-8 * |terms| ~1e-6;
  // 2e-5 absolute leaves margin and is far below any masking or head-mapping error (O(0.1)).
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << i;
  // probabilities: rows sum to one, zero above the diagonal
  const auto p = download(*be, cpu_attention_probs(*saved));
  for (int64_t row = 0; row < b * h * t; ++row) {
    const int64_t i = row % t;
    double sum = 0.0;
    for (int64_t j = 0; j < t; ++j) {
      if (j > i) {
        ASSERT_EQ(p[row * t + j], 0.0f);
      }
      sum += p[row * t + j];
    }
    ASSERT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST(ForwardReference, AttentionMatchesNaiveCausalSoftmax) {
  check_attention_against_reference(2, 9, 4, 4, 8);
}

TEST(ForwardReference, GroupedQueryAttentionMatchesRepeatedKeyValueHeads) {
  check_attention_against_reference(2, 9, 4, 2, 8);
  check_attention_against_reference(1, 7, 6, 1, 4);  // multi-query
}

TEST(ForwardReference, AttentionMatchesNaiveAcrossGemmBlocks) {
  check_attention_against_reference(1, 150, 2, 1, 16);  // 150 = 64 + 64 + 22
}

TEST(ForwardReference, RmsnormMatchesDefinition) {
  auto be = make_cpu_backend(2);
  const int64_t n = 5, d = 24;
  const float eps = 1e-5f;
  const auto x = random_vector<float>(n * d, 34, 3.0);
  const auto w = random_vector<float>(d, 35);
  Tensor xt = upload(*be, x, {n, d}), wt = upload(*be, w, {d});
  Tensor y = be->allocate("y", {n, d}, DType::F32, MemoryRole::Scratch),
         rstd = be->allocate("rstd", {n}, DType::F32, MemoryRole::Scratch);
  be->rmsnorm_forward(xt, wt, eps, y, rstd);
  const auto got = download(*be, y);
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0.0;
    for (int64_t j = 0; j < d; ++j) ms += double(x[i * d + j]) * x[i * d + j];
    const double r = 1.0 / std::sqrt(ms / d + eps);
    // a handful of fp32 roundings on O(1) results
    for (int64_t j = 0; j < d; ++j) ASSERT_NEAR(got[i * d + j], w[j] * x[i * d + j] * r, 1e-5);
  }
}

}  // namespace
}  // namespace gnmr
