// The cuBLASLt descriptors MaterializedAttention makes for each GEMM of the v1 attention plan
// (backend/cuda/attention_v1.h), read back attribute by attribute: the GEMM precision's compute
// type (fp32, or FAST_16BF under bf16), the plan's transposes, and every layout's rows, cols, ld,
// batch count and batch stride. Needs no GPU.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cublaslt_descriptors.h"

namespace gnmr::cuda {
namespace {

template <typename V>
V layout_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr) {
  V v{};
  size_t written = 0;
  GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutGetAttribute(l, attr, &v, sizeof v, &written), "test");
  EXPECT_EQ(written, sizeof v);
  return v;
}

int32_t desc_i32(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr) {
  int32_t v = -1;
  size_t written = 0;
  GNMR_CUBLASLT_CHECK(cublasLtMatmulDescGetAttribute(d, attr, &v, sizeof v, &written), "test");
  return v;
}

void expect_layout(cublasLtMatrixLayout_t l, const BatchedMatrix& m, int64_t batch_count) {
  SCOPED_TRACE(attention_tensor_name(m.tensor));
  EXPECT_EQ(layout_attr<uint32_t>(l, CUBLASLT_MATRIX_LAYOUT_TYPE), uint32_t(CUDA_R_32F));
  EXPECT_EQ(layout_attr<uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_ROWS), uint64_t(m.rows));
  EXPECT_EQ(layout_attr<uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_COLS), uint64_t(m.cols));
  EXPECT_EQ(layout_attr<int64_t>(l, CUBLASLT_MATRIX_LAYOUT_LD), m.ld);
  EXPECT_EQ(layout_attr<int32_t>(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT), int32_t(batch_count));
  EXPECT_EQ(layout_attr<int64_t>(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET), m.batch_stride);
}

TEST(AttentionGemmDescriptors, CarryThePlansTransposesLayoutsAndBatchStrides) {
  const AttentionPlan plan = plan_attention_v1({2, 128, 8, 2, 64});
  ASSERT_EQ(plan.gemms.size(), 6u);
  for (const AttentionGemmPlan& g : plan.gemms) {
    for (const GemmPrecision precision : {GemmPrecision::FP32, GemmPrecision::BF16}) {
      SCOPED_TRACE(std::string(attention_gemm_name(g.gemm)) +
                   (precision == GemmPrecision::BF16 ? " bf16" : " fp32"));
      AttentionGemmDescriptors d(g, precision);
      // fp32 never TF32 (the CPU's numerics); bf16 lets cuBLASLt round the fp32 operands.
      EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_COMPUTE_TYPE),
                int32_t(precision == GemmPrecision::BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                         : CUBLAS_COMPUTE_32F));
      EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_SCALE_TYPE), int32_t(CUDA_R_32F));
      EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_TRANSA),
                g.transa ? CUBLAS_OP_T : CUBLAS_OP_N);
      EXPECT_EQ(desc_i32(d.matmul(), CUBLASLT_MATMUL_DESC_TRANSB),
                g.transb ? CUBLAS_OP_T : CUBLAS_OP_N);
      EXPECT_EQ(g.batch_count, 2);  // the kv heads
      expect_layout(d.a(), g.a, g.batch_count);
      expect_layout(d.b(), g.b, g.batch_count);
      expect_layout(d.d(), g.d, g.batch_count);
    }
  }
  // Spot values from the header's table (T = 128, hd = 64, H = 8, Hkv = 2, group 4).
  const AttentionGemmPlan& scores = plan.gemms[size_t(AttentionGemm::kScores)];
  EXPECT_EQ(scores.b.ld, 8 * 64);            // a query head's rows step over all H heads
  EXPECT_EQ(scores.b.batch_stride, 4 * 64);  // batch member kv is query head 4 kv + g
  EXPECT_EQ(scores.a.batch_stride, 64);
  EXPECT_EQ(scores.d.batch_stride, 4 * 128 * 128);
}

}  // namespace
}  // namespace gnmr::cuda
