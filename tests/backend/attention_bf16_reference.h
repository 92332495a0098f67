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

// The gradients of the same function (dout rounded to bf16 too, as the kernel rounds it) and a
// bound per element. The kernel's delta = dout . out is taken from the fp32 dout and its own
// out, so it is off the exact delta_i by at most
//   D_i = u sum_d |dO_id| (|O_id| + vmax_d) + e sum_d |dO_id| vmax_d,
// (vmax_d = max_j |v_jd| over the row's keys, e = 2 (T + hd) 2^-24, the fp32 term of the
// forward's bound and of dP's sum); P is off by a relative n_i = e (1 + |lse_i| + max_j |s_ij|)
// (fp32 scores and exp). dS = P (dP - delta) is rounded to bf16 where it enters dQ and dK, so
// each dS_ij is off by at most E_ij = u |dS_ij| + P_ij D_i + P_ij n_i |dP_ij - delta_i|, and
//   |dQ_id - ref| <= scale sum_j E_ij |k_jd|,   |dK_jd - ref| <= scale sum_(h,i) E_ij |q_id|,
//   |dV_jd - ref| <= sum_(h,i) (u + n_i) P_ij |dO_id|     (P rounded to bf16 for P^T dO),
// each doubled for the second-order terms, plus e times the sum of the terms' magnitudes (the
// fp32 accumulation) and 1e-5.
struct Gradients {
  std::vector<double> dq, dk, dv;
  std::vector<double> dq_bound, dk_bound, dv_bound;
};

inline Gradients backward_reference(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const std::vector<float>& dout,
                                    const AttentionShape& s) {
  const int64_t hd = s.head_dim, group = s.heads / s.kv_heads, T = s.seq;
  const double scale = 1.0 / std::sqrt(double(hd));
  const double e = 2.0 * double(T + hd) * kFp32UnitRoundoff, u = kBf16UnitRoundoff;
  const auto bf = [](float x) { return double(round_to_bf16(x)); };
  const auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * s.heads + h) * hd; };
  const auto kj = [&](int64_t b, int64_t t, int64_t g) {
    return ((b * T + t) * s.kv_heads + g) * hd;
  };
  Gradients r;
  r.dq.assign(q.size(), 0.0), r.dq_bound.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0), r.dk_bound.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0), r.dv_bound.assign(v.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T)),
      o(static_cast<size_t>(hd)), vmax(static_cast<size_t>(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < T; ++i) {
        const size_t at_q = size_t(qi(b, i, h));
        double m = -INFINITY, s_max = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += bf(q[at_q + d]) * bf(k[size_t(kj(b, j, g) + d)]);
          p[size_t(j)] = dot * scale;
          m = std::max(m, p[size_t(j)]);
          s_max = std::max(s_max, std::fabs(p[size_t(j)]));
        }
        double l = 0;
        for (int64_t j = 0; j <= i; ++j) l += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
        for (int64_t j = 0; j <= i; ++j) p[size_t(j)] /= l;
        const double lse = m + std::log(l);
        const double eta = e * (1.0 + std::fabs(lse) + s_max);
        std::fill(o.begin(), o.end(), 0.0);
        std::fill(vmax.begin(), vmax.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            const double vj = bf(v[size_t(kj(b, j, g) + d)]);
            o[size_t(d)] += p[size_t(j)] * vj;
            vmax[size_t(d)] = std::max(vmax[size_t(d)], std::fabs(vj));
          }
        }
        double delta = 0, delta_bound = 0;
        for (int64_t d = 0; d < hd; ++d) {
          const double g_out = bf(dout[at_q + d]);
          delta += g_out * o[size_t(d)];
          delta_bound += std::fabs(g_out) *
                         (u * (std::fabs(o[size_t(d)]) + vmax[size_t(d)]) + e * vmax[size_t(d)]);
        }
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d)
            dot += bf(dout[at_q + d]) * bf(v[size_t(kj(b, j, g) + d)]);
          dp[size_t(j)] = dot;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double pij = p[size_t(j)], ds = pij * (dp[size_t(j)] - delta);
          const double err =
              u * std::fabs(ds) + pij * delta_bound + pij * eta * std::fabs(dp[size_t(j)] - delta);
          const size_t at_k = size_t(kj(b, j, g));
          for (int64_t d = 0; d < hd; ++d) {
            const double kd = bf(k[at_k + d]), qd = bf(q[at_q + d]), gd = bf(dout[at_q + d]);
            r.dq[at_q + d] += scale * ds * kd;
            r.dq_bound[at_q + d] += scale * (2.0 * err + e * std::fabs(ds)) * std::fabs(kd);
            r.dk[at_k + d] += scale * ds * qd;
            r.dk_bound[at_k + d] += scale * (2.0 * err + e * std::fabs(ds)) * std::fabs(qd);
            r.dv[at_k + d] += pij * gd;
            r.dv_bound[at_k + d] += (2.0 * (u + eta) + e) * pij * std::fabs(gd);
          }
        }
      }
    }
  }
  for (auto* bound : {&r.dq_bound, &r.dk_bound, &r.dv_bound}) {
    for (double& x : *bound) x += kExpLogSlack;
  }
  return r;
}

// Elements of `got` outside [want - bound, want + bound], and the worst one, as a message for
// the test to print ("" when none).
inline std::string violations(const char* what, const std::vector<float>& got,
                              const std::vector<double>& want, const std::vector<double>& bound) {
  size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= bound[i])) {
      ++bad;
      if (!(err - bound[i] <= worst_excess)) worst_excess = err - bound[i], worst = i;
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " " + what +
         " values outside the bound; worst at " + std::to_string(worst) + ": got " +
         std::to_string(got[worst]) + ", reference " + std::to_string(want[worst]) + ", bound " +
         std::to_string(bound[worst]);
}

inline std::string out_violations(const std::vector<float>& got, const Reference& r) {
  return violations("out", got, r.out, r.out_bound);
}
inline std::string lse_violations(const std::vector<float>& got, const Reference& r) {
  return violations("lse", got, r.lse, r.lse_bound);
}

}  // namespace gnmr::attention_bf16_reference
