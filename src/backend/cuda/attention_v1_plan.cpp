// The v1 attention's GEMMs and softmax launches as data (attention_v1_plan.h). CPU twin:
// src/backend/cpu/attention.cpp.
#include "backend/cuda/attention_v1_plan.h"

#include <cmath>
#include <string>

#include "util/error.h"

namespace gnmr::cuda {

const char* attention_tensor_name(AttentionTensor tensor) {
  switch (tensor) {
    case AttentionTensor::kQ:
      return "q";
    case AttentionTensor::kK:
      return "k";
    case AttentionTensor::kV:
      return "v";
    case AttentionTensor::kOut:
      return "out";
    case AttentionTensor::kProbs:
      return "probs";
    case AttentionTensor::kDOut:
      return "dout";
    case AttentionTensor::kDScores:
      return "dscores";
    case AttentionTensor::kDq:
      return "dq";
    case AttentionTensor::kDk:
      return "dk";
    case AttentionTensor::kDv:
      return "dv";
  }
  return "?";
}

const char* attention_gemm_name(AttentionGemm gemm) {
  switch (gemm) {
    case AttentionGemm::kScores:
      return "scores";
    case AttentionGemm::kOut:
      return "out";
    case AttentionGemm::kDProbs:
      return "dprobs";
    case AttentionGemm::kDq:
      return "dq";
    case AttentionGemm::kDk:
      return "dk";
    case AttentionGemm::kDv:
      return "dv";
  }
  return "?";
}

namespace {

// The operand kinds of the table in the header, per head: a head of a [B, T, heads, hd] tensor
// (column-major hd x T, ld = heads * hd) and a T x T matrix of P or dS.
struct Extents {
  int64_t t, hd, ld_q, ld_kv, group, tt;
};

BatchedMatrix query_head(AttentionTensor tensor, const Extents& e) {
  return {tensor, e.hd, e.t, e.ld_q, e.group * e.hd};
}
BatchedMatrix kv_head(AttentionTensor tensor, const Extents& e) {
  return {tensor, e.hd, e.t, e.ld_kv, e.hd};
}
BatchedMatrix square(AttentionTensor tensor, const Extents& e) {
  return {tensor, e.t, e.t, e.t, e.group * e.tt};
}

AttentionGemmPlan make_gemm(AttentionGemm gemm, int64_t m, int64_t n, int64_t k, bool transa,
                            bool transb, float alpha, int64_t batch_count, BatchedMatrix a,
                            BatchedMatrix b, BatchedMatrix d) {
  AttentionGemmPlan p;
  p.gemm = gemm;
  p.m = m, p.n = n, p.k = k;
  p.transa = transa, p.transb = transb;
  p.alpha = alpha;
  p.batch_count = batch_count;
  p.a = a, p.b = b, p.d = d;
  return p;
}

AttentionStep gemm_step(AttentionGemm gemm, int64_t batch, int64_t g, int64_t a_offset,
                        int64_t b_offset, int64_t d_offset, float beta) {
  AttentionStep step;
  step.kind = AttentionStepKind::kGemm;
  step.gemm = int(gemm);
  step.call = {batch, g, a_offset, b_offset, d_offset, beta};
  return step;
}

}  // namespace

AttentionPlan plan_attention_v1(const AttentionShape& s) {
  if (s.batch <= 0 || s.seq <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 ||
      s.heads % s.kv_heads != 0) {
    throw Error(ErrorKind::Config,
                "attention: shape B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
                    " H=" + std::to_string(s.heads) + " Hkv=" + std::to_string(s.kv_heads) +
                    " hd=" + std::to_string(s.head_dim) +
                    " is not usable (all positive, heads a multiple of kv_heads)");
  }
  const Extents e{
      s.seq,        s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.heads / s.kv_heads,
      s.seq * s.seq};
  AttentionPlan plan;
  plan.shape = s;
  plan.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));  // the CPU's float expression
  const int64_t hkv = s.kv_heads;
  using G = AttentionGemm;
  using X = AttentionTensor;
  plan.gemms = {
      make_gemm(G::kScores, e.t, e.t, e.hd, true, false, plan.scale, hkv, kv_head(X::kK, e),
                query_head(X::kQ, e), square(X::kProbs, e)),
      make_gemm(G::kOut, e.hd, e.t, e.t, false, false, 1.0f, hkv, kv_head(X::kV, e),
                square(X::kProbs, e), query_head(X::kOut, e)),
      make_gemm(G::kDProbs, e.t, e.t, e.hd, true, false, 1.0f, hkv, kv_head(X::kV, e),
                query_head(X::kDOut, e), square(X::kDScores, e)),
      make_gemm(G::kDq, e.hd, e.t, e.t, false, false, 1.0f, hkv, kv_head(X::kK, e),
                square(X::kDScores, e), query_head(X::kDq, e)),
      make_gemm(G::kDk, e.hd, e.t, e.t, false, true, 1.0f, hkv, query_head(X::kQ, e),
                square(X::kDScores, e), kv_head(X::kDk, e)),
      make_gemm(G::kDv, e.hd, e.t, e.t, false, true, 1.0f, hkv, query_head(X::kDOut, e),
                square(X::kProbs, e), kv_head(X::kDv, e)),
  };

  // Offsets of batch member 0 (kv head 0, query head g) of batch b.
  const auto q_at = [&](int64_t b, int64_t g) { return b * e.t * e.ld_q + g * e.hd; };
  const auto kv_at = [&](int64_t b) { return b * e.t * e.ld_kv; };
  const auto p_at = [&](int64_t b, int64_t g) { return (b * s.heads + g) * e.tt; };
  const auto ds_at = [&](int64_t g) { return g * e.tt; };  // the scratch holds one batch

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < e.group; ++g) {
      plan.forward.push_back(gemm_step(G::kScores, b, g, kv_at(b), q_at(b, g), p_at(b, g), 0.0f));
    }
  }
  AttentionStep softmax;
  softmax.kind = AttentionStepKind::kSoftmaxForward;
  softmax.matrices = s.batch * s.heads;
  plan.forward.push_back(softmax);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < e.group; ++g) {
      plan.forward.push_back(gemm_step(G::kOut, b, g, kv_at(b), p_at(b, g), q_at(b, g), 0.0f));
    }
  }

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < e.group; ++g) {
      plan.backward.push_back(gemm_step(G::kDProbs, b, g, kv_at(b), q_at(b, g), ds_at(g), 0.0f));
    }
    AttentionStep backward;
    backward.kind = AttentionStepKind::kSoftmaxBackward;
    backward.probs_offset = p_at(b, 0);
    backward.dscores_offset = 0;
    backward.matrices = s.heads;
    plan.backward.push_back(backward);
    for (int64_t g = 0; g < e.group; ++g) {
      plan.backward.push_back(gemm_step(G::kDq, b, g, kv_at(b), ds_at(g), q_at(b, g), 0.0f));
    }
    for (int64_t g = 0; g < e.group; ++g) {
      const float beta = g == 0 ? 0.0f : 1.0f;  // the group's heads add up in order g = 0, 1, ...
      plan.backward.push_back(gemm_step(G::kDk, b, g, q_at(b, g), ds_at(g), kv_at(b), beta));
      plan.backward.push_back(gemm_step(G::kDv, b, g, q_at(b, g), p_at(b, g), kv_at(b), beta));
    }
  }
  return plan;
}

int64_t attention_v1_backward_scratch_floats(const AttentionShape& s) {
  return s.heads * s.seq * s.seq;
}

}  // namespace gnmr::cuda
