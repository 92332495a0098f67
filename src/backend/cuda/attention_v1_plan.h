// The v1 (materialised) CUDA attention as plain data: the six strided-batched cuBLASLt GEMMs and
// the two causal-softmax kernel launches, in execution order, from a pure host function, so
// every index rule is tested on a machine without a GPU (tests/backend/test_attention_v1_plan.cpp
// executes the plan with a host GEMM and matches cpu::attention_forward / attention_backward).
// MaterializedAttention (attention_v1.h) runs it. CPU twin: src/backend/cpu/attention.cpp.
//
// Row-major tensors (fp32): q, out, dq [B, T, H, hd]; k, v, dk, dv [B, T, Hkv, hd]; probs P
// [B, H, T, T]; the backward's scratch dS: one batch's [H, T, T]. A row-major X [r, c] with row
// stride ld is the column-major c x r matrix cuBLASLt reads with that ld, so per head, with
// D column-major m x n (the row-major result):
//
//   gemm     result            m   n   k   A stored (op)      B stored (op)     alpha
//   scores   S = q k^T   [T,T] T   T   hd  k   hd x T  (T)    q    hd x T (N)   1/sqrt(hd)
//   out      O = P v    [T,hd] hd  T   T   v   hd x T  (N)    P    T x T  (N)   1
//   dprobs   dP = dO v^T [T,T] T   T   hd  v   hd x T  (T)    dO   hd x T (N)   1
//   dq       dq = dS k  [T,hd] hd  T   T   k   hd x T  (N)    dS   T x T  (N)   1
//   dk       dk = dS^T q       hd  T   T   q   hd x T  (N)    dS   T x T  (T)   1, beta 0 then 1
//   dv       dv = P^T dO       hd  T   T   dO  hd x T  (N)    P    T x T  (T)   1, beta 0 then 1
//
// The scale of the backward sits where the CPU puts it: inside dS = scale * P * (dP - rowsum),
// so dq and dk run with alpha 1.
//
// GQA (query head h reads kv head h / group, group = H / Hkv): one call per batch b and group
// index g, batched over the Hkv kv heads; batch member kv is query head kv * group + g, so query
// tensors step by group * hd (P and dS by group * T * T) and kv tensors by hd. dk and dv add the
// group's query heads in the fixed order g = 0, 1, ... (beta 0 for g = 0, then 1), as the CPU
// does, so the result is deterministic. The batch index b cannot join the batch dimension
// (q's batch stride T * H * hd and its head stride differ), hence B * group calls per GEMM.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace gnmr::cuda {

// The device buffers a plan step reads or writes.
enum class AttentionTensor { kQ, kK, kV, kOut, kProbs, kDOut, kDScores, kDq, kDk, kDv };
enum class AttentionGemm { kScores, kOut, kDProbs, kDq, kDk, kDv };

const char* attention_tensor_name(AttentionTensor tensor);  // "q", "probs", "dscores", ...
const char* attention_gemm_name(AttentionGemm gemm);        // "scores", "out", "dprobs", ...

// One operand as cuBLASLt's matrix layout holds it (before op()): column-major rows x cols with
// leading dimension ld, batch member i at `batch_stride * i` floats past the call's offset.
struct BatchedMatrix {
  AttentionTensor tensor = AttentionTensor::kQ;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;  // floats
};

// One cublasLtMatmul of a GEMM: where its batch member 0 starts in each tensor (floats from the
// tensor's base pointer) and whether it accumulates.
struct AttentionGemmCall {
  int64_t batch = 0;        // b
  int64_t group_index = 0;  // g: batch member kv is query head kv * group + g
  int64_t a_offset = 0, b_offset = 0, d_offset = 0;
  float beta = 0.0f;
};

// One distinct strided-batched GEMM (one cached set of descriptors): D = alpha op(A) op(B) +
// beta D, fp32 in and out, fp32 compute; C is D.
struct AttentionGemmPlan {
  AttentionGemm gemm = AttentionGemm::kScores;
  int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  float alpha = 1.0f;
  int64_t batch_count = 1;
  BatchedMatrix a, b, d;
};

enum class AttentionStepKind { kGemm, kSoftmaxForward, kSoftmaxBackward };

// One launch. kGemm: gemms[gemm] with `call`. kSoftmaxForward: `matrices` T x T score matrices
// at probs + probs_offset, in place. kSoftmaxBackward: dS = scale * P * (dP - rowsum(P dP)) for
// `matrices` matrices of P at probs + probs_offset and of dP (in place into dS) at
// dscores + dscores_offset.
struct AttentionStep {
  AttentionStepKind kind = AttentionStepKind::kGemm;
  int gemm = -1;
  AttentionGemmCall call;
  int64_t probs_offset = 0, dscores_offset = 0, matrices = 0;
};

struct AttentionPlan {
  AttentionShape shape{};
  float scale = 1.0f;                    // 1 / sqrt(hd) in float, as the CPU computes it
  std::vector<AttentionGemmPlan> gemms;  // indexed by int(AttentionGemm)
  std::vector<AttentionStep> forward;    // B*group scores, 1 softmax, B*group out
  std::vector<AttentionStep> backward;   // per b: group dP, 1 softmax bwd, group dq, group (dk, dv)
};

// Error(Config) unless every extent is positive and H is a multiple of Hkv.
AttentionPlan plan_attention_v1(const AttentionShape& s);

// Floats of the dS scratch the backward needs beyond P: one batch's [H, T, T] (the backward runs
// batch by batch, so the scratch is 1/B of P).
int64_t attention_v1_backward_scratch_floats(const AttentionShape& s);

}  // namespace gnmr::cuda
