// Causal softmax attention with grouped-query attention (Hugging Face eager attention:
// softmax(q k^T * hd^-0.5 + causal mask) v, kv head = query head / (H / Hkv)).
// Per (batch, head) the score and value products are BLAS GEMMs over 64-row blocks that
// stop at the diagonal block, so the masked upper triangle is mostly never computed.
// The probabilities [B, H, T, T] are kept for the backward pass.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/isa_clones.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/vector_math.h"

namespace gnmr {
namespace cpu {

namespace {
constexpr int64_t kBlock = 64;  // query rows per GEMM block

// p: [t, t] scores -> causal softmax probabilities in place (row i keeps keys 0..i, zeros after).
// Called inside the parallel region, so it can be compiled per instruction set for the exp.
template <typename T>
GNMR_ISA_CLONES void causal_softmax(T* p, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    T* row = p + i * t;
    const T max_score = row_max(row, i + 1);
    const T inv_sum = static_cast<T>(1.0 / exp_shifted_sum(row, max_score, row, i + 1));
    for (int64_t j = 0; j <= i; ++j) row[j] *= inv_sum;
    std::fill(row + i + 1, row + t, T(0));
  }
}

}  // namespace

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs,
                       const AttentionShape& s, int threads) {
  const int64_t t = s.seq, hd = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t ld_q = s.heads * hd, ld_kv = s.kv_heads * hd;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const T* qh = q + b * t * ld_q + h * hd;             // [t, hd], row stride ld_q
      const T* kh = k + b * t * ld_kv + (h / group) * hd;  // [t, hd], row stride ld_kv
      const T* vh = v + b * t * ld_kv + (h / group) * hd;
      T* oh = out + b * t * ld_q + h * hd;
      T* p = probs + (b * s.heads + h) * t * t;  // [t, t]
      // scores: rows [r0, r1) against keys [0, r1)
      for (int64_t r0 = 0; r0 < t; r0 += kBlock) {
        const int64_t r1 = std::min(t, r0 + kBlock);
        gemm<T>(false, true, r1 - r0, r1, hd, scale, qh + r0 * ld_q, ld_q, kh, ld_kv, T(0),
                p + r0 * t, t);
      }
      causal_softmax(p, t);
      for (int64_t r0 = 0; r0 < t; r0 += kBlock) {
        const int64_t r1 = std::min(t, r0 + kBlock);
        gemm<T>(false, false, r1 - r0, hd, r1, T(1), p + r0 * t, t, vh, ld_kv, T(0), oh + r0 * ld_q,
                ld_q);
      }
    }
  }
}

int64_t attention_backward_workspace(const AttentionShape& s, int threads) {
  return static_cast<int64_t>(std::max(threads, 1)) * s.seq * s.seq;
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                        T* dk, T* dv, const AttentionShape& s, T* workspace, int threads) {
  // With P = softmax(S), S = scale q k^T, O = P v:
  //   dP = dO v^T;  dS = P (dP - rowsum(P dP));  dq = scale dS k;  dk = scale dS^T q;  dv = P^T dO
  // One task per (batch, kv head) so the query heads sharing a kv head add into dk, dv in a
  // fixed order without races.
  const int64_t t = s.seq, hd = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t ld_q = s.heads * hd, ld_kv = s.kv_heads * hd;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      T* ds = workspace + static_cast<int64_t>(omp_get_thread_num()) * t * t;  // [t, t]
      const T* kg = k + b * t * ld_kv + g * hd;
      const T* vg = v + b * t * ld_kv + g * hd;
      T* dkg = dk + b * t * ld_kv + g * hd;
      T* dvg = dv + b * t * ld_kv + g * hd;
      for (int64_t r = 0; r < group; ++r) {
        const int64_t h = g * group + r;
        const T* qh = q + b * t * ld_q + h * hd;
        const T* doh = dout + b * t * ld_q + h * hd;
        T* dqh = dq + b * t * ld_q + h * hd;
        const T* p = probs + (b * s.heads + h) * t * t;
        const T beta = r == 0 ? T(0) : T(1);
        for (int64_t r0 = 0; r0 < t; r0 += kBlock) {
          const int64_t r1 = std::min(t, r0 + kBlock);
          // dP rows [r0, r1), keys [0, r1)
          gemm<T>(false, true, r1 - r0, r1, hd, T(1), doh + r0 * ld_q, ld_q, vg, ld_kv, T(0),
                  ds + r0 * t, t);
          for (int64_t i = r0; i < r1; ++i) {
            const T* prow = p + i * t;
            T* row = ds + i * t;
            T dot = T(0);
            for (int64_t j = 0; j <= i; ++j) dot += prow[j] * row[j];
            for (int64_t j = 0; j <= i; ++j) row[j] = scale * prow[j] * (row[j] - dot);
            std::fill(row + i + 1, row + r1, T(0));
          }
          gemm<T>(false, false, r1 - r0, hd, r1, T(1), ds + r0 * t, t, kg, ld_kv, T(0),
                  dqh + r0 * ld_q, ld_q);
        }
        // key rows [c0, c1) receive from query rows [c0, t)
        for (int64_t c0 = 0; c0 < t; c0 += kBlock) {
          const int64_t c1 = std::min(t, c0 + kBlock);
          gemm<T>(true, false, c1 - c0, hd, t - c0, T(1), ds + c0 * t + c0, t, qh + c0 * ld_q, ld_q,
                  beta, dkg + c0 * ld_kv, ld_kv);
          gemm<T>(true, false, c1 - c0, hd, t - c0, T(1), p + c0 * t + c0, t, doh + c0 * ld_q, ld_q,
                  beta, dvg + c0 * ld_kv, ld_kv);
        }
      }
    }
  }
}

#define GNMR_INSTANTIATE(T)                                                                       \
  template void attention_forward<T>(const T*, const T*, const T*, T*, T*, const AttentionShape&, \
                                     int);                                                        \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,   \
                                      T*, const AttentionShape&, T*, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
