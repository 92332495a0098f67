// GemmPlan -> cuBLASLt descriptors (cublaslt_descriptors.h).
#include "backend/cuda/cublaslt_descriptors.h"

#include <cstdint>

#include "util/error.h"

namespace gnmr {

namespace {

int32_t cublas_scale_mode(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::kVec128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScaleMode::kBlk128x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case ScaleMode::kNone:
    case ScaleMode::kRowAfterGemm:  // applied by our kernel after the GEMM, not by cuBLASLt
      break;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// A row-major [rows, cols] operand is the column-major cols x rows matrix cuBLASLt reads.
cublasLtMatrixLayout_t operand_layout(const GemmOperand& o, const std::string& what) {
  cublasLtMatrixLayout_t layout = nullptr;
  GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&layout, cuda_data_type(o.type), uint64_t(o.cols),
                                                 uint64_t(o.rows), o.cols),
                      what + ", operand " + o.tensor);
  return layout;
}

}  // namespace

void check_cublaslt(cublasStatus_t status, const char* call, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorKind::Runtime, std::string("cuBLASLt: ") + call +
                                      " failed: " + cublasLtGetStatusString(status) + " (" +
                                      std::to_string(int(status)) + ") for " + what);
}

cudaDataType_t cuda_data_type(GemmOperandType type) {
  switch (type) {
    case GemmOperandType::kF32:
      return CUDA_R_32F;
    case GemmOperandType::kBF16:
      return CUDA_R_16BF;
    case GemmOperandType::kE4M3:
      return CUDA_R_8F_E4M3;
    case GemmOperandType::kE5M2:
      return CUDA_R_8F_E5M2;
    case GemmOperandType::kS8:
      return CUDA_R_8I;
    case GemmOperandType::kS32:
      return CUDA_R_32I;
  }
  return CUDA_R_32F;
}

void create_matmul_descriptor(cublasLtMatmulDesc_t& matmul, cublasComputeType_t compute,
                              cudaDataType_t scale, bool transa, bool transb,
                              const std::string& what) {
  GNMR_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&matmul, compute, scale), what);
  const int32_t op_a = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t op_b = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
      what);
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
      what);
}

void destroy_lt_descriptors(cublasLtMatmulDesc_t& matmul, cublasLtMatrixLayout_t& a,
                            cublasLtMatrixLayout_t& b, cublasLtMatrixLayout_t& d) {
  for (cublasLtMatrixLayout_t* layout : {&a, &b, &d}) {
    if (*layout) cublasLtMatrixLayoutDestroy(*layout);
    *layout = nullptr;
  }
  if (matmul) cublasLtMatmulDescDestroy(matmul);
  matmul = nullptr;
}

LtGemmDescriptors::LtGemmDescriptors(const GemmPlan& plan) {
  what_ = std::string(gemm_role_name(plan.role)) + " " + gemm_impl_name(plan.impl) + " " +
          std::to_string(plan.m) + " x " + std::to_string(plan.n) + " x " + std::to_string(plan.k);
  try {
    // fp32 accumulation (never TF32: CUBLAS_COMPUTE_32F, not _FAST_TF32), or the int8 GEMM's
    // exact int32 accumulation with int32 alpha and beta.
    const bool int8 = plan.impl == GemmImpl::kInt8;
    create_matmul_descriptor(matmul_, int8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                             int8 ? CUDA_R_32I : CUDA_R_32F, plan.transa, plan.transb, what_);
    if (plan.impl == GemmImpl::kFp8Block) {
      const int32_t a_mode = cublas_scale_mode(plan.a.scale_mode);
      const int32_t b_mode = cublas_scale_mode(plan.b.scale_mode);
      // Block-scaled FP8 refuses fast accumulation (partial sums must be promoted).
      const int8_t fast_accum = 0;
      GNMR_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(matmul_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                         &a_mode, sizeof a_mode),
                          what_);
      GNMR_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(matmul_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                         &b_mode, sizeof b_mode),
                          what_);
      GNMR_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(matmul_, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                         &fast_accum, sizeof fast_accum),
                          what_);
    }
    a_ = operand_layout(plan.a, what_);
    b_ = operand_layout(plan.b, what_);
    GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d_, cuda_data_type(plan.d_type),
                                                   uint64_t(plan.m), uint64_t(plan.n), plan.ldc),
                        what_ + ", output");
  } catch (...) {
    destroy();
    throw;
  }
}

LtGemmDescriptors::~LtGemmDescriptors() {
  destroy();
}

void LtGemmDescriptors::destroy() {
  destroy_lt_descriptors(matmul_, a_, b_, d_);
}

}  // namespace gnmr
