// GemmPlan -> cublasLtMatmul, with cached descriptors and algorithms (cublaslt_gemm.h).
#include "backend/cuda/cublaslt_gemm.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/operand_alignment.h"
#include "kernels/cuda_check.cuh"
#include "util/error.h"

namespace gnmr {

namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The alignments (A, B, D bytes) the heuristic is told: those of the operands' starts and leading
// dimensions (operand_alignment.h).
std::array<uint32_t, 3> operand_alignments(const GemmPlan& plan, const void* a, const void* b,
                                           const void* d) {
  return {operand_alignment_bytes(a, plan.lda * gemm_operand_bytes(plan.a.type)),
          operand_alignment_bytes(b, plan.ldb * gemm_operand_bytes(plan.b.type)),
          operand_alignment_bytes(d, plan.ldc * gemm_operand_bytes(plan.d_type))};
}

// Those of operands that start on the allocator's 256-byte boundaries: their leading
// dimensions' (address 0 divides by any power of two).
std::array<uint32_t, 3> allocated_alignments(const GemmPlan& plan) {
  return operand_alignments(plan, nullptr, nullptr, nullptr);
}

}  // namespace

std::string gemm_plan_key(const GemmPlan& p) {
  std::string key = std::string(gemm_role_name(p.role)) + "/" + gemm_impl_name(p.impl);
  for (int64_t v :
       {p.m, p.n, p.k, p.lda, p.ldb, p.ldc, int64_t(p.transa), int64_t(p.transb), int64_t(p.a.type),
        int64_t(p.b.type), int64_t(p.a.scale_mode), int64_t(p.b.scale_mode)}) {
    key += "/" + std::to_string(v);
  }
  return key + (p.beta != 0.0f ? "/acc" : "/set");
}

LtGemmRunner::LtGemmRunner() {
  GNMR_CUBLASLT_CHECK(cublasLtCreate(&handle_), "the cuBLASLt handle");
  GNMR_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&preference_), "the matmul preference");
  const uint64_t workspace = kWorkspaceBytes;
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace, sizeof workspace),
      "the matmul preference");
  GNMR_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));  // 256-byte aligned, as required
}

// Destroy calls have nothing actionable to report from a destructor.
LtGemmRunner::~LtGemmRunner() {
  cache_.clear();
  if (workspace_) cudaFree(workspace_);
  if (preference_) cublasLtMatmulPreferenceDestroy(preference_);
  if (handle_) cublasLtDestroy(handle_);
}

void LtGemmRunner::set_scale_pointers(Prepared& p, const float* a_scales, const float* b_scales) {
  const std::string& what = p.descriptors->what();
  if (!aligned16(a_scales) || !aligned16(b_scales)) {
    throw Error(ErrorKind::Runtime, "cuBLASLt: " + what + ": scales are not 16-byte aligned");
  }
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(p.descriptors->matmul(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                     &a_scales, sizeof a_scales),
      what);
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(p.descriptors->matmul(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                     &b_scales, sizeof b_scales),
      what);
}

int LtGemmRunner::ask_heuristic(Prepared& p, const std::array<uint32_t, 3>& align, int count,
                                cublasLtMatmulHeuristicResult_t* results, cublasStatus_t* status) {
  const std::array<cublasLtMatmulPreferenceAttributes_t, 4> attributes = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const std::array<uint32_t, 4> values = {align[0], align[1], align[2], align[2]};  // C = D
  for (size_t i = 0; i < attributes.size(); ++i) {
    GNMR_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference_, attributes[i], &values[i],
                                                             sizeof values[i]),
                        "the matmul preference");
  }
  int found = 0;
  *status = cublasLtMatmulAlgoGetHeuristic(handle_, p.descriptors->matmul(), p.descriptors->a(),
                                           p.descriptors->b(), p.descriptors->c(),
                                           p.descriptors->d(), preference_, count, results, &found);
  return *status == CUBLAS_STATUS_SUCCESS ? found : 0;
}

LtGemmRunner::Prepared& LtGemmRunner::prepare(const GemmPlan& plan,
                                              const std::array<uint32_t, 3>& align,
                                              const float* a_scales, const float* b_scales) {
  std::string key = gemm_plan_key(plan);
  for (uint32_t a : align) key += "/" + std::to_string(a);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  Prepared p;
  p.descriptors = std::make_unique<LtGemmDescriptors>(plan);
  // A block scale mode without its scale pointer is refused by the heuristic, or worse, answered
  // with an algorithm that ignores the scales: the pointers go in first (run() sets them again
  // on every call, since they change).
  if (plan.impl == GemmImpl::kFp8Block) set_scale_pointers(p, a_scales, b_scales);
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  if (ask_heuristic(p, align, 1, &p.heuristic, &status) == 0) {
    p.refusal = "cuBLASLt has no algorithm for " + p.descriptors->what() + " (" + key + ", " +
                cublasLtGetStatusString(status) + ")";
  }
  return cache_.emplace(key, std::move(p)).first->second;
}

// The sweep and the ranking ask about operands as the backend allocates them (256-byte aligned
// starts). An FP8 plan's scale pointers must be set for the question to be the one run() asks;
// the workspace stands in for them (device memory, 256-byte aligned; nothing is read before a
// matmul runs).
LtGemmRunner::Prepared& LtGemmRunner::prepare_allocated(const GemmPlan& plan) {
  const float* scales =
      plan.impl == GemmImpl::kFp8Block ? static_cast<const float*>(workspace_) : nullptr;
  return prepare(plan, allocated_alignments(plan), scales, scales);
}

std::string LtGemmRunner::check_algorithm(const GemmPlan& plan) {
  return prepare_allocated(plan).refusal;
}

std::vector<cublasLtMatmulHeuristicResult_t> LtGemmRunner::ranked_algorithms(const GemmPlan& plan,
                                                                             int max_count) {
  GNMR_CHECK(max_count >= 1, "LtGemmRunner::ranked_algorithms: max_count " +
                                 std::to_string(max_count) + " (at least 1)");
  Prepared& p = prepare_allocated(plan);
  if (!p.refusal.empty()) throw Error(ErrorKind::Runtime, p.refusal);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_count));
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  results.resize(
      size_t(ask_heuristic(p, allocated_alignments(plan), max_count, results.data(), &status)));
  // A result whose own state is not success is not an algorithm to run (cuBLASLt's docs).
  results.erase(std::remove_if(results.begin(), results.end(),
                               [](const cublasLtMatmulHeuristicResult_t& r) {
                                 return r.state != CUBLAS_STATUS_SUCCESS;
                               }),
                results.end());
  return results;
}

void LtGemmRunner::run(const GemmPlan& plan, const void* a, const float* a_scales, const void* b,
                       const float* b_scales, void* d, cudaStream_t stream) {
  Prepared& p = prepare(plan, operand_alignments(plan, a, b, d), a_scales, b_scales);
  if (!p.refusal.empty()) throw Error(ErrorKind::Runtime, p.refusal);
  matmul(p, p.heuristic.algo, plan, a, a_scales, b, b_scales, d, stream);
}

void LtGemmRunner::run_algorithm(const cublasLtMatmulAlgo_t& algorithm, const GemmPlan& plan,
                                 const void* a, const float* a_scales, const void* b,
                                 const float* b_scales, void* d, cudaStream_t stream) {
  const std::array<uint32_t, 3> align = operand_alignments(plan, a, b, d);
  GNMR_CHECK(align == allocated_alignments(plan),
             "LtGemmRunner::run_algorithm: " + gemm_plan_key(plan) +
                 ": the ranked algorithms assume operands that start on 256-byte boundaries (A " +
                 std::to_string(align[0]) + ", B " + std::to_string(align[1]) + ", D " +
                 std::to_string(align[2]) + " bytes)");
  Prepared& p = prepare(plan, align, a_scales, b_scales);
  if (!p.refusal.empty()) throw Error(ErrorKind::Runtime, p.refusal);
  matmul(p, algorithm, plan, a, a_scales, b, b_scales, d, stream);
}

void LtGemmRunner::matmul(Prepared& p, const cublasLtMatmulAlgo_t& algorithm, const GemmPlan& plan,
                          const void* a, const float* a_scales, const void* b,
                          const float* b_scales, void* d, cudaStream_t stream) {
  const bool fp8 = plan.impl == GemmImpl::kFp8Block;
  GNMR_CHECK(
      fp8 == (a_scales != nullptr) && fp8 == (b_scales != nullptr),
      "LtGemmRunner::run: scales are given exactly for FP8 plans (" + gemm_plan_key(plan) + ")");
  const std::string& what = p.descriptors->what();
  if (!aligned16(a) || !aligned16(b) || !aligned16(d)) {
    throw Error(ErrorKind::Runtime, "cuBLASLt: " + what + ": an operand is not 16-byte aligned");
  }
  if (fp8) set_scale_pointers(p, a_scales, b_scales);
  // alpha and beta have the descriptor's scale type: int32 for the int8 GEMM (which never
  // accumulates), else fp32.
  const float alpha_f32 = 1.0f, beta_f32 = plan.beta;
  const int32_t alpha_s32 = 1, beta_s32 = 0;
  const bool int8 = plan.impl == GemmImpl::kInt8;
  GNMR_CHECK(!int8 || plan.beta == 0.0f, "LtGemmRunner::run: an int8 plan cannot accumulate");
  const void* alpha = int8 ? static_cast<const void*>(&alpha_s32) : &alpha_f32;
  const void* beta = int8 ? static_cast<const void*>(&beta_s32) : &beta_f32;
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmul(handle_, p.descriptors->matmul(), alpha, a, p.descriptors->a(), b,
                     p.descriptors->b(), beta, d, p.descriptors->c(), d, p.descriptors->d(),
                     &algorithm, workspace_, kWorkspaceBytes, stream),
      what);
}

}  // namespace gnmr
