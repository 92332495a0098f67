// MaterializedAttention: the v1 CUDA attention (docs/DESIGN.md §6), the CPU's
// exact algorithm on the GPU. It runs plan_attention_v1 (attention_v1_plan.h): strided-batched
// cuBLASLt GEMMs for q k^T, P v and the four backward products, and the fused causal softmax
// kernels (kernels/attention_ops.cuh) in between. P [B, H, T, T] is materialised and kept for
// the backward. The GEMMs follow the run's GEMM precision: fp32 (the CPU's numerics), or under
// bf16 cuBLASLt's tensor cores on the same fp32 buffers (attention_v1_compute_type), the
// softmax fp32 either way. CPU twin: gnmr::cpu::attention_forward / attention_backward
// (src/backend/cpu/attention.cpp). Needs a GPU to run; its descriptors need none.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/attention_v1_plan.h"

namespace gnmr::cuda {

// The compute type of v1's GEMMs under a GEMM precision: fp32 is CUBLAS_COMPUTE_32F (never
// TF32: the CPU's numerics); bf16 is CUBLAS_COMPUTE_32F_FAST_16BF, which lets cuBLASLt round
// the fp32 operands to bf16 (or TF32) on their way into the tensor cores and accumulate in fp32:
// the precision the projections' bf16 GEMMs run at, with no bf16 copy of the T x T matrices.
cublasComputeType_t attention_v1_compute_type(GemmPrecision precision);

// The cuBLASLt descriptors of one AttentionGemmPlan: the precision's compute type, the plan's
// transposes, and fp32 layouts carrying BATCH_COUNT and STRIDED_BATCH_OFFSET; C = D.
// Host-only, so tests read them back without a GPU.
class AttentionGemmDescriptors {
 public:
  AttentionGemmDescriptors(const AttentionGemmPlan& plan, GemmPrecision precision);
  ~AttentionGemmDescriptors();
  AttentionGemmDescriptors(const AttentionGemmDescriptors&) = delete;
  AttentionGemmDescriptors& operator=(const AttentionGemmDescriptors&) = delete;

  cublasLtMatmulDesc_t matmul() const { return matmul_; }
  cublasLtMatrixLayout_t a() const { return a_; }
  cublasLtMatrixLayout_t b() const { return b_; }
  cublasLtMatrixLayout_t d() const { return d_; }
  // "attention dk 64 x 128 x 128, batch 2" (", bf16" appended under bf16)
  const std::string& what() const { return what_; }

 private:
  void destroy();

  std::string what_;
  cublasLtMatmulDesc_t matmul_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
};

class MaterializedAttention {
 public:
  // handle/workspace: the backend's cuBLASLt handle and workspace (workspace_bytes); used for
  // every call.
  MaterializedAttention(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes);
  ~MaterializedAttention();
  MaterializedAttention(const MaterializedAttention&) = delete;
  MaterializedAttention& operator=(const MaterializedAttention&) = delete;

  // Floats of device scratch the backward needs beyond P (dP/dS), for this shape.
  static int64_t backward_scratch_floats(const AttentionShape& s);

  // q, out: [B, T, H, hd]; k, v: [B, T, Hkv, hd]; probs: [B, H, T, T] device, kept until the
  // backward. out and probs are overwritten. precision: the GEMMs' (attention_v1_compute_type).
  void forward(const float* q, const float* k, const float* v, float* out, float* probs,
               const AttentionShape& s, GemmPrecision precision, cudaStream_t stream);
  // dq, dk, dv overwritten. scratch: backward_scratch_floats(s) floats.
  void backward(const float* q, const float* k, const float* v, const float* probs,
                const float* dout, float* dq, float* dk, float* dv, float* scratch,
                const AttentionShape& s, GemmPrecision precision, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gnmr::cuda
