// The cuBLASLt descriptors made from each GemmPlan, read back attribute by attribute. Creating
// and reading descriptors needs no GPU, so this runs (label cpu) on CI machines without one and
// catches a wrong transpose, layout or scale mode before a GPU ever sees it.
#include <gtest/gtest.h>

#include <cstdint>

#include "backend/cuda/cublaslt_descriptors.h"
#include "backend/cuda/device_probe.h"

namespace gnmr {
namespace {

int32_t desc_i32(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr) {
  int32_t v = -1;
  size_t written = 0;
  GNMR_CUBLASLT_CHECK(cublasLtMatmulDescGetAttribute(d, attr, &v, sizeof v, &written), "test");
  EXPECT_EQ(written, sizeof v);
  return v;
}

struct Layout {
  int64_t rows, cols, ld;
  int32_t type;
};

Layout read_layout(cublasLtMatrixLayout_t l) {
  Layout out{};
  uint64_t rows = 0, cols = 0;
  size_t written = 0;
  GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows,
                                                       sizeof rows, &written),
                      "test");
  GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                                       sizeof cols, &written),
                      "test");
  GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &out.ld,
                                                       sizeof out.ld, &written),
                      "test");
  GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &out.type,
                                                       sizeof out.type, &written),
                      "test");
  out.rows = int64_t(rows), out.cols = int64_t(cols);
  return out;
}

// op(A) must be m x k and op(B) k x n for the plan's transposes, D m x n.
void expect_consistent(const GemmPlan& p) {
  SCOPED_TRACE(std::string(gemm_role_name(p.role)) + " " + gemm_impl_name(p.impl));
  LtGemmDescriptors d(p);
  const bool int8 = p.impl == GemmImpl::kInt8;
  EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_COMPUTE_TYPE),
            int32_t(int8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F));
  EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_SCALE_TYPE),
            int32_t(int8 ? CUDA_R_32I : CUDA_R_32F));
  EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_TRANSA),
            p.transa ? CUBLAS_OP_T : CUBLAS_OP_N);
  EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_TRANSB),
            p.transb ? CUBLAS_OP_T : CUBLAS_OP_N);
  const Layout a = read_layout(d.a()), b = read_layout(d.b()), c = read_layout(d.d());
  const int64_t a_rows = p.transa ? a.cols : a.rows, a_cols = p.transa ? a.rows : a.cols;
  const int64_t b_rows = p.transb ? b.cols : b.rows, b_cols = p.transb ? b.rows : b.cols;
  EXPECT_EQ(a_rows, p.m);
  EXPECT_EQ(a_cols, p.k);
  EXPECT_EQ(b_rows, p.k);
  EXPECT_EQ(b_cols, p.n);
  EXPECT_EQ(a.ld, p.lda);
  EXPECT_EQ(b.ld, p.ldb);
  EXPECT_GE(a.ld, a.rows);  // column-major: the leading dimension covers a column
  EXPECT_GE(b.ld, b.rows);
  EXPECT_EQ(c.rows, p.m);
  EXPECT_EQ(c.cols, p.n);
  EXPECT_EQ(c.ld, p.m);
  EXPECT_EQ(c.type, int32_t(int8 ? CUDA_R_32I : CUDA_R_32F));
  EXPECT_EQ(read_layout(d.c()).type, c.type);
  EXPECT_EQ(d.c(), d.d()) << "in place: one layout handle for C and D";
  EXPECT_EQ(a.type, int32_t(cuda_data_type(p.a.type)));
  if (p.impl == GemmImpl::kFp8Block) {
    EXPECT_EQ(a.type, int32_t(CUDA_R_8F_E4M3));
    EXPECT_TRUE(p.transa && !p.transb) << "FP8 must be TN";
    EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
              p.a.scale_mode == ScaleMode::kVec128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                   : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
    EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_B_SCALE_MODE),
              CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
  }
  if (int8) {
    EXPECT_EQ(a.type, int32_t(CUDA_R_8I));
    EXPECT_EQ(b.type, int32_t(CUDA_R_8I));
    EXPECT_TRUE(p.transa && !p.transb) << "IMMA with the regular order must be TN";
    EXPECT_EQ(a.ld % 4, 0);
    EXPECT_EQ(b.ld % 4, 0);
    EXPECT_EQ(c.ld % 4, 0);
  }
}

TEST(CublasLtDescriptors, EveryRoleAndImplementationReadsBackAsPlanned) {
  PathSpec fp8;
  fp8.kind = PathKind::kFineGrainedFp;
  PathSpec bf16;
  bf16.kind = PathKind::kBf16Gemm;
  PathSpec backend;
  PathSpec int8;
  int8.kind = PathKind::kInt8Gemm;
  for (GemmRole role : {GemmRole::kForward, GemmRole::kInputGradient, GemmRole::kWeightGradient}) {
    expect_consistent(
        plan_gemm(role, 192, 656, 320, int8, GemmPrecision::FP32, GpuTarget{90}, false));
    expect_consistent(
        plan_gemm(role, 192, 656, 320, fp8, GemmPrecision::FP32, GpuTarget{90}, false));
    expect_consistent(
        plan_gemm(role, 192, 656, 320, bf16, GemmPrecision::FP32, GpuTarget{90}, false));
    expect_consistent(
        plan_gemm(role, 192, 656, 320, backend, GemmPrecision::FP32, GpuTarget{80}, false));
    // The 1B GPU shape: ffn 5632 on 8 x 1024 tokens.
    expect_consistent(
        plan_gemm(role, 8192, 2048, 5632, fp8, GemmPrecision::FP32, GpuTarget{90}, false));
  }
}

TEST(CublasLtDescriptors, AFailingCallNamesItselfAndTheShape) {
  try {
    check_cublaslt(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul(...)",
                   "forward fp8_block 8 x 8 x 8");
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cublasLtMatmul"), std::string::npos) << m;
    EXPECT_NE(m.find("forward fp8_block 8 x 8 x 8"), std::string::npos) << m;
    EXPECT_NE(m.find("(15)"), std::string::npos) << m;
  }
}

TEST(CudaDeviceProbe, SaysWhatIsMissingOrWhatWasFound) {
  const CudaDeviceProbe p = probe_cuda_device(0);
  if (p.usable) {
    EXPECT_TRUE(p.problem.empty());
    EXPECT_NE(p.device.find("sm_"), std::string::npos) << p.device;
  } else {
    // Without a GPU (CI): the driver or the device is named, never a bare error code.
    EXPECT_TRUE(p.problem.find("driver") != std::string::npos ||
                p.problem.find("no CUDA device") != std::string::npos)
        << p.problem;
  }
  EXPECT_FALSE(probe_cuda_device(4096).usable);  // no machine has 4097 GPUs
  EXPECT_TRUE(cuda_build_runs_on(90));
  EXPECT_TRUE(cuda_build_runs_on(80));
  EXPECT_FALSE(cuda_build_runs_on(75));
}

}  // namespace
}  // namespace gnmr
