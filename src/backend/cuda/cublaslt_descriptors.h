// A GemmPlan as cuBLASLt descriptors: the matmul descriptor (compute type, transposes, block
// scale modes, no fast accumulation) and the four matrix layouts. Host code; creating and
// reading descriptors needs no GPU, so this is tested in CI on machines without one. The CUDA
// backend caches one per shape and role; scale pointers are set per call (device memory).
#pragma once

#include <cublasLt.h>

#include <string>

#include "backend/cuda/gemm_plan.h"

namespace gnmr {

// Throws Error(Runtime) naming the call, cuBLASLt's status string and `what` (the shape).
void check_cublaslt(cublasStatus_t status, const char* call, const std::string& what);
#define GNMR_CUBLASLT_CHECK(call, what) ::gnmr::check_cublaslt((call), #call, (what))

cudaDataType_t cuda_data_type(GemmOperandType type);

// Creates `matmul` (compute type `compute`, scale type `scale`) with op(A) and op(B) set from
// transa / transb. Error(Runtime) naming `what` where cuBLASLt refuses; `matmul` is then null
// or the descriptor made so far, for the caller's cleanup (destroy_lt_descriptors).
void create_matmul_descriptor(cublasLtMatmulDesc_t& matmul, cublasComputeType_t compute,
                              cudaDataType_t scale, bool transa, bool transb,
                              const std::string& what);

// Destroys the matmul descriptor and each layout that exists, leaving them null. Destroy cannot
// fail for a valid handle, and its status is not actionable in the destructors that call this.
void destroy_lt_descriptors(cublasLtMatmulDesc_t& matmul, cublasLtMatrixLayout_t& a,
                            cublasLtMatrixLayout_t& b, cublasLtMatrixLayout_t& d);

class LtGemmDescriptors {
 public:
  explicit LtGemmDescriptors(const GemmPlan& plan);
  ~LtGemmDescriptors();
  LtGemmDescriptors(const LtGemmDescriptors&) = delete;
  LtGemmDescriptors& operator=(const LtGemmDescriptors&) = delete;

  cublasLtMatmulDesc_t matmul() const { return matmul_; }
  cublasLtMatrixLayout_t a() const { return a_; }
  cublasLtMatrixLayout_t b() const { return b_; }
  // C is D (every plan writes in place, accumulating or not): one layout handle for both, as
  // cuBLASLt asks of an in-place matmul (Cdesc == Ddesc). Column-major m x n, d_type.
  cublasLtMatrixLayout_t c() const { return d_; }
  cublasLtMatrixLayout_t d() const { return d_; }
  const std::string& what() const { return what_; }  // "forward fp8_block 320 x 192 x 656"

 private:
  void destroy();

  std::string what_;
  cublasLtMatmulDesc_t matmul_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
};

}  // namespace gnmr
