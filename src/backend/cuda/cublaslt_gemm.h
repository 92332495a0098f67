// LtGemmRunner: runs GemmPlans on cuBLASLt. One handle and one 32 MiB workspace (cuBLAS's
// recommendation for sm_90); per plan the descriptors and the heuristic's algorithm are made
// once and cached (llm.c and llm.q rebuild both on every call). Needs a GPU.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cublaslt_descriptors.h"
#include "backend/cuda/gemm_plan.h"

namespace gnmr {

// Everything that makes two plans different GEMMs for cuBLASLt (the cache key).
std::string gemm_plan_key(const GemmPlan& plan);

class LtGemmRunner {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  LtGemmRunner();  // Error(Runtime) naming the call when there is no usable GPU
  ~LtGemmRunner();
  LtGemmRunner(const LtGemmRunner&) = delete;
  LtGemmRunner& operator=(const LtGemmRunner&) = delete;

  // d = op(a) op(b) + plan.beta * d, queued on `stream`. Device pointers in the plan's layouts
  // and types; a_scales / b_scales (dequantization multipliers, passed as is) only for
  // kFp8Block, else null. d is fp32, or for kInt8 the int32 sums (the caller scales them:
  // dequantize_int8_gemm_output). An emulated plan is its fp32 GEMM: the caller fake-quantized
  // the inputs. Error(Runtime) naming the plan when cuBLASLt has no algorithm or a pointer is
  // not 16-byte aligned.
  void run(const GemmPlan& plan, const void* a, const float* a_scales, const void* b,
           const float* b_scales, void* d, cudaStream_t stream);

  // "" when cuBLASLt has an algorithm for the plan, else why not (the gpu_check sweep).
  std::string check_algorithm(const GemmPlan& plan);

  // The heuristic's algorithms for the plan, its ranking (run() takes the first), at most
  // max_count, for operands as the backend allocates them (starting on 256-byte boundaries).
  // bench_gpu_gemm times each against the first. Error(Runtime) naming the plan when there is
  // none.
  std::vector<cublasLtMatmulHeuristicResult_t> ranked_algorithms(const GemmPlan& plan,
                                                                 int max_count);
  // run() with one of ranked_algorithms' algorithms instead of the first. Error(Runtime) unless
  // a, b and d start on 256-byte boundaries, as ranked_algorithms assumed.
  void run_algorithm(const cublasLtMatmulAlgo_t& algorithm, const GemmPlan& plan, const void* a,
                     const float* a_scales, const void* b, const float* b_scales, void* d,
                     cudaStream_t stream);

  // The handle and workspace, shared with the backend's other cuBLASLt users (attention v1).
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

 private:
  struct Prepared {
    std::unique_ptr<LtGemmDescriptors> descriptors;
    cublasLtMatmulHeuristicResult_t heuristic{};
    std::string refusal;  // non-empty: no algorithm
  };
  // Alignments of A, B and D in bytes (operand_alignment.h): part of the cache key, since the
  // heuristic's algorithm may rely on them. a_scales / b_scales: the FP8 plan's scale pointers,
  // set before the heuristic is asked (block scale modes need them; null for other plans).
  Prepared& prepare(const GemmPlan& plan, const std::array<uint32_t, 3>& align,
                    const float* a_scales, const float* b_scales);
  // prepare() for operands as the backend allocates them (check_algorithm, ranked_algorithms).
  Prepared& prepare_allocated(const GemmPlan& plan);
  // Sets the FP8 descriptor's A and B scale pointers (device memory, 16-byte aligned).
  void set_scale_pointers(Prepared& p, const float* a_scales, const float* b_scales);
  // The heuristic's best `count` algorithms for p's descriptors and operands of these alignments
  // (A, B, D bytes): how many it wrote to results (0 with *status saying why, or none found).
  int ask_heuristic(Prepared& p, const std::array<uint32_t, 3>& align, int count,
                    cublasLtMatmulHeuristicResult_t* results, cublasStatus_t* status);
  // The matmul itself, with p's descriptors and the given algorithm.
  void matmul(Prepared& p, const cublasLtMatmulAlgo_t& algorithm, const GemmPlan& plan,
              const void* a, const float* a_scales, const void* b, const float* b_scales, void* d,
              cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::string, Prepared> cache_;
};

}  // namespace gnmr
