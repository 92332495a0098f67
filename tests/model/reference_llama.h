// A naive double-precision LLaMA-2 forward written straight from the Hugging Face
// LlamaForCausalLM code, independent of the backend: the truth the model is checked against.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "model/param_table.h"

namespace gnmr {
namespace testing {

using Matrix = std::vector<double>;  // row-major

// y[n, out] = x[n, in] W[out, in]^T
inline Matrix linear(const Matrix& x, const Matrix& w, int64_t n, int64_t in, int64_t out) {
  Matrix y(static_cast<size_t>(n * out), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t j = 0; j < in; ++j) s += x[i * in + j] * w[o * in + j];
      y[i * out + o] = s;
    }
  return y;
}

inline Matrix rmsnorm(const Matrix& x, const Matrix& w, int64_t n, int64_t d, double eps) {
  Matrix y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0.0;
    for (int64_t j = 0; j < d; ++j) ms += x[i * d + j] * x[i * d + j];
    const double r = 1.0 / std::sqrt(ms / d + eps);
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = w[j] * (x[i * d + j] * r);
  }
  return y;
}

// In place on x[b, t, heads, hd]: x * cos + rotate_half(x) * sin.
inline void rope(Matrix& x, int64_t b, int64_t t, int64_t heads, int64_t hd, double theta) {
  const int64_t half = hd / 2;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t pos = 0; pos < t; ++pos)
      for (int64_t h = 0; h < heads; ++h) {
        double* row = x.data() + ((bi * t + pos) * heads + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = pos / std::pow(theta, 2.0 * i / hd);
          const double x1 = row[i], x2 = row[i + half];
          row[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          row[i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
}

// Mean cross-entropy over positions with target >= 0.
// weights: by index of build_param_table(c).params.
inline double reference_loss(const ModelConfig& c, const ParamTable& table,
                             const std::vector<Matrix>& weights, const std::vector<int32_t>& tokens,
                             const std::vector<int32_t>& targets, int64_t b, int64_t t) {
  const int64_t n = b * t, d = c.dim, f = c.ffn_dim, v = c.vocab_size, hd = c.head_dim();
  const int64_t h = c.n_heads, hkv = c.n_kv_heads, rep = h / hkv;
  Matrix x(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) x[i * d + j] = weights[table.embedding][tokens[i] * d + j];
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerParamIndex& p = table.layers[l];
    const auto& W = [&](ProjectionKind k) -> const Matrix& {
      return weights[p.proj[static_cast<int>(k)]];
    };
    const Matrix xn = rmsnorm(x, weights[p.input_norm], n, d, c.norm_eps);
    Matrix q = linear(xn, W(ProjectionKind::Q), n, d, h * hd);
    Matrix k = linear(xn, W(ProjectionKind::K), n, d, hkv * hd);
    const Matrix vv = linear(xn, W(ProjectionKind::V), n, d, hkv * hd);
    rope(q, b, t, h, hd, c.rope_theta);
    rope(k, b, t, hkv, hd, c.rope_theta);
    Matrix att(static_cast<size_t>(n * d), 0.0);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t head = 0; head < h; ++head)
        for (int64_t i = 0; i < t; ++i) {
          std::vector<double> p_row(static_cast<size_t>(i + 1));
          double max_s = -INFINITY, sum = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0.0;
            for (int64_t e = 0; e < hd; ++e)
              s += q[((bi * t + i) * h + head) * hd + e] *
                   k[((bi * t + j) * hkv + head / rep) * hd + e];
            p_row[j] = s / std::sqrt(static_cast<double>(hd));
            max_s = std::max(max_s, p_row[j]);
          }
          for (double& s : p_row) sum += (s = std::exp(s - max_s));
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t e = 0; e < hd; ++e)
              att[((bi * t + i) * h + head) * hd + e] +=
                  p_row[j] / sum * vv[((bi * t + j) * hkv + head / rep) * hd + e];
        }
    const Matrix o = linear(att, W(ProjectionKind::O), n, d, d);
    Matrix hres(x.size());
    for (size_t i = 0; i < x.size(); ++i) hres[i] = x[i] + o[i];
    const Matrix xn2 = rmsnorm(hres, weights[p.post_norm], n, d, c.norm_eps);
    const Matrix g = linear(xn2, W(ProjectionKind::Gate), n, d, f);
    const Matrix u = linear(xn2, W(ProjectionKind::Up), n, d, f);
    Matrix a(g.size());
    for (size_t i = 0; i < g.size(); ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    const Matrix down = linear(a, W(ProjectionKind::Down), n, f, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] = hres[i] + down[i];
  }
  const Matrix xf = rmsnorm(x, weights[table.final_norm], n, d, c.norm_eps);
  const Matrix logits = linear(xf, weights[table.lm_head], n, d, v);
  double total = 0.0;
  int count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    double max_l = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < v; ++j) max_l = std::max(max_l, logits[i * v + j]);
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[i * v + j] - max_l);
    total += std::log(sum) + max_l - logits[i * v + targets[i]];
    ++count;
  }
  return total / count;
}

}  // namespace testing
}  // namespace gnmr
