// The flash-attention CPU twin (flash_attention.h): online softmax over key tiles forward,
// two deterministic passes backward.
#include "backend/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "util/error.h"

namespace gnmr {
namespace cpu {

namespace {

struct Index {
  const AttentionShape& s;
  int64_t q(int64_t b, int64_t t, int64_t h) const {
    return ((b * s.seq + t) * s.heads + h) * s.head_dim;
  }
  int64_t kv(int64_t b, int64_t t, int64_t g) const {
    return ((b * s.seq + t) * s.kv_heads + g) * s.head_dim;
  }
  int64_t row(int64_t b, int64_t h, int64_t t) const { return (b * s.heads + h) * s.seq + t; }
};

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

void check_tiling(const AttentionShape& s, const FlashTiling& tiles) {
  GNMR_CHECK(tiles.seq == s.seq && tiles.q_tile > 0 && tiles.kv_tile > 0,
             "flash attention: tiling for seq " + std::to_string(tiles.seq) + ", shape seq " +
                 std::to_string(s.seq));
  GNMR_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0, "flash attention: heads % kv_heads");
}

}  // namespace

void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                             const AttentionShape& s, const FlashTiling& tiles, int threads) {
  check_tiling(s, tiles);
  const Index at{s};
  const int64_t hd = s.head_dim, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float minus_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads, g = h / group;
    std::vector<float> m(size_t(tiles.q_tile)), l(size_t(tiles.q_tile)),
        acc(size_t(tiles.q_tile * hd)), p(size_t(tiles.kv_tile));
    for (int64_t qi = 0; qi < flash_q_tiles(tiles); ++qi) {
      const int64_t r0 = qi * tiles.q_tile, rows = flash_tile_rows(qi, tiles.q_tile, s.seq);
      std::fill(m.begin(), m.end(), minus_inf);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t kj = 0; kj <= flash_last_kv_tile(tiles, qi); ++kj) {
        const int64_t c0 = kj * tiles.kv_tile, cols = flash_tile_rows(kj, tiles.kv_tile, s.seq);
        const bool masked = flash_tile_is_masked(tiles, qi, kj);
        for (int64_t i = 0; i < rows; ++i) {
          const float* qrow = q + at.q(b, r0 + i, h);
          float tile_max = minus_inf;
          for (int64_t j = 0; j < cols; ++j) {
            p[size_t(j)] = masked && c0 + j > r0 + i
                               ? minus_inf
                               : dot(qrow, k + at.kv(b, c0 + j, g), hd) * scale;
            tile_max = std::fmax(tile_max, p[size_t(j)]);
          }
          // Key tile 0 always holds key 0, which every query sees: m is finite after it.
          const float m_new = std::fmax(m[size_t(i)], tile_max);
          const float rescale = std::exp(m[size_t(i)] - m_new);
          float row_sum = 0.0f;
          float* a = acc.data() + i * hd;
          for (int64_t d = 0; d < hd; ++d) a[d] *= rescale;
          for (int64_t j = 0; j < cols; ++j) {
            const float pij = std::exp(p[size_t(j)] - m_new);
            row_sum += pij;
            const float* vrow = v + at.kv(b, c0 + j, g);
            for (int64_t d = 0; d < hd; ++d) a[d] += pij * vrow[d];
          }
          l[size_t(i)] = l[size_t(i)] * rescale + row_sum;
          m[size_t(i)] = m_new;
        }
      }
      for (int64_t i = 0; i < rows; ++i) {
        float* o = out + at.q(b, r0 + i, h);
        for (int64_t d = 0; d < hd; ++d) o[d] = acc[size_t(i * hd + d)] / l[size_t(i)];
        lse[at.row(b, h, r0 + i)] = m[size_t(i)] + std::log(l[size_t(i)]);
      }
    }
  }
}

void flash_attention_backward(const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const float* dout, float* dq, float* dk, float* dv,
                              const AttentionShape& s, const FlashTiling& tiles, int threads) {
  check_tiling(s, tiles);
  const Index at{s};
  const int64_t hd = s.head_dim, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // D_i = dO_i . O_i, the softmax backward's row term.
  std::vector<float> delta(size_t(s.batch * s.heads * s.seq));
#pragma omp parallel for num_threads(threads)
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads;
    for (int64_t t = 0; t < s.seq; ++t) {
      delta[size_t(at.row(b, h, t))] = dot(dout + at.q(b, t, h), out + at.q(b, t, h), hd);
    }
  }
  // The recomputed probability and its score gradient of (query r, head h) and key c.
  auto p_and_ds = [&](int64_t b, int64_t h, int64_t g, int64_t r, int64_t c, float& p, float& ds) {
    p = std::exp(dot(q + at.q(b, r, h), k + at.kv(b, c, g), hd) * scale - lse[at.row(b, h, r)]);
    const float dp = dot(dout + at.q(b, r, h), v + at.kv(b, c, g), hd);
    ds = p * (dp - delta[size_t(at.row(b, h, r))]);
  };

  // Pass 1: one key tile of one kv head owns its dK and dV rows.
  const int64_t kv_tiles = flash_kv_tiles(tiles);
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t task = 0; task < s.batch * s.kv_heads * kv_tiles; ++task) {
    const int64_t b = task / (s.kv_heads * kv_tiles), g = task / kv_tiles % s.kv_heads,
                  kj = task % kv_tiles;
    const int64_t c0 = kj * tiles.kv_tile, cols = flash_tile_rows(kj, tiles.kv_tile, s.seq);
    std::vector<float> dk_tile(size_t(cols * hd), 0.0f), dv_tile(size_t(cols * hd), 0.0f);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t qi = flash_first_q_tile(tiles, kj); qi < flash_q_tiles(tiles); ++qi) {
        const int64_t r0 = qi * tiles.q_tile, rows = flash_tile_rows(qi, tiles.q_tile, s.seq);
        const bool masked = flash_tile_is_masked(tiles, qi, kj);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            if (masked && c0 + j > r0 + i) continue;
            float p, ds;
            p_and_ds(b, h, g, r0 + i, c0 + j, p, ds);
            const float* qrow = q + at.q(b, r0 + i, h);
            const float* dorow = dout + at.q(b, r0 + i, h);
            for (int64_t d = 0; d < hd; ++d) {
              dv_tile[size_t(j * hd + d)] += p * dorow[d];
              dk_tile[size_t(j * hd + d)] += ds * qrow[d] * scale;
            }
          }
        }
      }
    }
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t d = 0; d < hd; ++d) {
        dk[at.kv(b, c0 + j, g) + d] = dk_tile[size_t(j * hd + d)];
        dv[at.kv(b, c0 + j, g) + d] = dv_tile[size_t(j * hd + d)];
      }
    }
  }

  // Pass 2: one query tile of one head owns its dQ rows.
  const int64_t q_tiles = flash_q_tiles(tiles);
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t task = 0; task < s.batch * s.heads * q_tiles; ++task) {
    const int64_t b = task / (s.heads * q_tiles), h = task / q_tiles % s.heads, qi = task % q_tiles;
    const int64_t g = h / group;
    const int64_t r0 = qi * tiles.q_tile, rows = flash_tile_rows(qi, tiles.q_tile, s.seq);
    for (int64_t i = 0; i < rows; ++i) {
      float* dqrow = dq + at.q(b, r0 + i, h);
      for (int64_t d = 0; d < hd; ++d) dqrow[d] = 0.0f;
      for (int64_t kj = 0; kj <= flash_last_kv_tile(tiles, qi); ++kj) {
        const int64_t c0 = kj * tiles.kv_tile, cols = flash_tile_rows(kj, tiles.kv_tile, s.seq);
        const bool masked = flash_tile_is_masked(tiles, qi, kj);
        for (int64_t j = 0; j < cols; ++j) {
          if (masked && c0 + j > r0 + i) continue;
          float p, ds;
          p_and_ds(b, h, g, r0 + i, c0 + j, p, ds);
          const float* krow = k + at.kv(b, c0 + j, g);
          for (int64_t d = 0; d < hd; ++d) dqrow[d] += ds * krow[d] * scale;
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace gnmr
