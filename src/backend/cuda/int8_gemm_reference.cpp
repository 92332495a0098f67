// The int8 GEMM, on the CPU (int8_gemm_reference.h).
#include "backend/cuda/int8_gemm_reference.h"

#include "precision/int8_gemm_output.h"
#include "util/error.h"

namespace gnmr {

void int8_gemm_reference(const GemmPlan& plan, const std::vector<int8_t>& a_codes,
                         const std::vector<float>& a_scales, const std::vector<int8_t>& b_codes,
                         const std::vector<float>& b_scales, std::vector<float>& d) {
  GNMR_CHECK(plan.impl == GemmImpl::kInt8 && plan.transa && !plan.transb && plan.beta == 0.0f,
             "int8_gemm_reference: not a TN int8 plan without accumulation");
  const GemmOperand &a = plan.a, &b = plan.b;
  GNMR_CHECK(a.rows == plan.m && b.rows == plan.n && a.cols == plan.k && b.cols == plan.k,
             "int8_gemm_reference: operands do not match m, n, k");
  GNMR_CHECK(plan.k <= kInt8GemmMaxK, "int8_gemm_reference: k could overflow an int32 sum");
  GNMR_CHECK(a_codes.size() == size_t(a.rows * a.cols) && b_codes.size() == size_t(b.rows * b.cols),
             "int8_gemm_reference: code buffers of the wrong size");
  GNMR_CHECK(a_scales.size() == size_t(plan.m) && b_scales.size() == size_t(plan.n),
             "int8_gemm_reference: scale buffers of the wrong size");
  d.assign(size_t(plan.m * plan.n), 0.0f);
  for (int64_t j = 0; j < plan.n; ++j) {
    for (int64_t i = 0; i < plan.m; ++i) {
      // TN: op(A)[i, k] = A stored [i, k]; op(B)[k, j] = B stored [j, k].
      int32_t sum = 0;
      for (int64_t k = 0; k < plan.k; ++k) {
        sum += int32_t{a_codes[size_t(i * a.cols + k)]} * int32_t{b_codes[size_t(j * b.cols + k)]};
      }
      d[size_t(i + j * plan.m)] = int8_gemm_output(sum, a_scales[size_t(i)], b_scales[size_t(j)]);
    }
  }
}

}  // namespace gnmr
