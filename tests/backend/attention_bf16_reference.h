// The reference for attention on bf16 operands (kernels/flash_attention_mma.cu): causal GQA
// attention of q, k, v rounded to bf16, computed in double, and the bound a kernel's output
// must meet against it. Used by the host emulation (test_flash_attention_emulated.cpp) and on
// a GPU (tests/gpu/test_gpu_flash_attention.cpp).
//
// The bounds. A kernel that rounds only P to bf16 before P V (relative error at most u = 2^-8,
// bf16's unit roundoff) and otherwise sums in fp32 gives, per output element of row i,
//   |out - ref| <= u * sum_j p_ij |v_jd| / sum_j p_ij + fp32 error <= u * max_j |v_jd| + ...
// since the row's weights p_ij / sum p_ij are a convex combination. The fp32 error of an inner
// product of K terms in any order is at most ~K * 2^-24 of the sum of the terms' magnitudes;
// the longest sums here are over the keys (T) and over the head dim (hd), so the fp32 term is
// 2 (T + hd) 2^-24 max |v| for out, and 2 (T + hd) 2^-24 (1 + |lse|) for lse = m + log(sum of
// T exps), which has no bf16 rounding beyond the inputs'. 1e-5 absolute covers the few-ulp
// exp / log. An index, mask or tile error moves outputs by O(1), far beyond either bound.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "precision/bf16.h"

namespace gnmr::attention_bf16_reference {

constexpr double kBf16UnitRoundoff = 1.0 / 256;        // 2^-8
constexpr double kFp32UnitRoundoff = 1.0 / (1 << 24);  // 2^-24
constexpr double kExpLogSlack = 1e-5;

struct Reference {
  std::vector<double> out, lse;              // [B, T, H, hd] and [B, H, T]
  std::vector<double> out_bound, lse_bound;  // per element, as the header says
};

inline Reference reference(const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, const AttentionShape& s) {
  const int64_t hd = s.head_dim, group = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(double(hd));
  const auto bf = [](float x) { return double(round_to_bf16(x)); };
  Reference r;
  r.out.assign(size_t(s.batch * s.seq * s.heads * hd), 0.0);
  r.out_bound.assign(r.out.size(), 0.0);
  r.lse.assign(size_t(s.batch * s.heads * s.seq), 0.0);
  r.lse_bound.assign(r.lse.size(), 0.0);
  const double fp32_error = 2.0 * double(s.seq + hd) * kFp32UnitRoundoff;
  std::vector<double> p(size_t(s.seq));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t t = 0; t < s.seq; ++t) {
        const float* qi = q.data() + ((b * s.seq + t) * s.heads + h) * hd;
        double m = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          const float* kj = k.data() + ((b * s.seq + j) * s.kv_heads + g) * hd;
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += bf(qi[d]) * bf(kj[d]);
          p[size_t(j)] = dot * scale;
          m = std::max(m, p[size_t(j)]);
        }
        double l = 0;
        for (int64_t j = 0; j <= t; ++j) l += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
        const size_t row = size_t((b * s.heads + h) * s.seq + t);
        r.lse[row] = m + std::log(l);
        r.lse_bound[row] = fp32_error * (1.0 + std::fabs(r.lse[row])) + kExpLogSlack;
        const size_t o = size_t(((b * s.seq + t) * s.heads + h) * hd);
        for (int64_t d = 0; d < hd; ++d) {
          double sum = 0, v_max = 0;
          for (int64_t j = 0; j <= t; ++j) {
            const double vj = bf(v[size_t(((b * s.seq + j) * s.kv_heads + g) * hd + d)]);
            sum += p[size_t(j)] * vj;
            v_max = std::max(v_max, std::fabs(vj));
          }
          r.out[o + size_t(d)] = sum / l;
          r.out_bound[o + size_t(d)] = (kBf16UnitRoundoff + fp32_error) * v_max + kExpLogSlack;
        }
      }
    }
  }
  return r;
}

// Elements of `got` outside the reference's bound, and the worst one, as a message for the
// test to print ("" when none).
inline std::string out_violations(const std::vector<float>& got, const Reference& r) {
  size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - r.out[i]);
    if (!(err <= r.out_bound[i])) {
      ++bad;
      if (!(err - r.out_bound[i] <= worst_excess)) worst_excess = err - r.out_bound[i], worst = i;
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) +
         " outputs outside the bf16 bound; worst at " + std::to_string(worst) + ": got " +
         std::to_string(got[worst]) + ", reference " + std::to_string(r.out[worst]) + ", bound " +
         std::to_string(r.out_bound[worst]);
}

inline std::string lse_violations(const std::vector<float>& got, const Reference& r) {
  size_t bad = 0, worst = 0;
  double worst_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - r.lse[i]);
    if (!(err <= r.lse_bound[i])) {
      ++bad;
      if (!(err <= worst_err)) worst_err = err, worst = i;
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) +
         " lse values outside the fp32 bound; worst at " + std::to_string(worst) + ": got " +
         std::to_string(got[worst]) + ", reference " + std::to_string(r.lse[worst]) + ", bound " +
         std::to_string(r.lse_bound[worst]);
}

}  // namespace gnmr::attention_bf16_reference
