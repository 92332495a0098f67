// cuBLASLt's block-scaled FP8 GEMM, emulated on the CPU from its definition.
#include "backend/cuda/block_scaled_gemm_reference.h"

#include "precision/scale_layout.h"
#include "util/error.h"

namespace gnmr {

namespace {

// The scale of element (row, k) of an operand stored [rows, k] under `mode`.
float operand_scale(const GemmOperand& o, const std::vector<float>& scales, int64_t row,
                    int64_t k_block) {
  const int64_t i = o.scale_mode == ScaleMode::kVec128
                        ? vec128_scale_index(row, k_block, o.rows)
                        : blk128_scale_index(row / kScaleBlock, k_block, o.cols);
  return scales[static_cast<size_t>(i)];
}

}  // namespace

void block_scaled_gemm_reference(const GemmPlan& plan, FpFormat format,
                                 const std::vector<uint8_t>& a_codes,
                                 const std::vector<float>& a_scales,
                                 const std::vector<uint8_t>& b_codes,
                                 const std::vector<float>& b_scales, std::vector<float>& d) {
  GNMR_CHECK(plan.impl == GemmImpl::kFp8Block && plan.transa && !plan.transb,
             "block_scaled_gemm_reference: not a TN FP8 plan");
  const GemmOperand &a = plan.a, &b = plan.b;
  GNMR_CHECK(a.rows == plan.m && b.rows == plan.n && a.cols == plan.k && b.cols == plan.k,
             "block_scaled_gemm_reference: operands do not match m, n, k");
  GNMR_CHECK(a_codes.size() == size_t(a.rows * a.cols) && b_codes.size() == size_t(b.rows * b.cols),
             "block_scaled_gemm_reference: code buffers of the wrong size");
  GNMR_CHECK(a_scales.size() == size_t(a.scale_count) && b_scales.size() == size_t(b.scale_count),
             "block_scaled_gemm_reference: scale buffers of the wrong size");
  GNMR_CHECK(d.size() == size_t(plan.m * plan.n), "block_scaled_gemm_reference: d size");
  const int64_t k_blocks = block_count(plan.k, kScaleBlock);
  for (int64_t j = 0; j < plan.n; ++j) {
    for (int64_t i = 0; i < plan.m; ++i) {
      double sum = 0.0;
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        double block = 0.0;
        for (int64_t k = kb * kScaleBlock; k < (kb + 1) * kScaleBlock && k < plan.k; ++k) {
          // TN: op(A)[i, k] = A stored [i, k]; op(B)[k, j] = B stored [j, k].
          block += double(decode_fp_storage(format, a_codes[size_t(i * a.cols + k)])) *
                   double(decode_fp_storage(format, b_codes[size_t(j * b.cols + k)]));
        }
        sum += double(operand_scale(a, a_scales, i, kb)) *
               double(operand_scale(b, b_scales, j, kb)) * block;
      }
      float& out = d[size_t(i + j * plan.m)];
      out = float(sum + double(plan.beta) * double(out));
    }
  }
}

}  // namespace gnmr
