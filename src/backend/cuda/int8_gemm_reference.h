// A CPU twin of the int8 GEMM the CUDA backend runs (gemm_plan.h, GemmImpl::kInt8): cuBLASLt's
// int8 x int8 -> int32 matmul, exact, followed by the epilogue kernel's scaling
// (kernels/dequantize_int8_gemm_output.cu), reading operands and scales as the plan lays them
// out. The sum is exact on both sides and the scaling is the same function
// (precision/int8_gemm_output.h), so on a GPU the real GEMM must give these bits; on the CPU it
// is checked against the fake-quantize + fp32 GEMM the CPU backend runs.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/gemm_plan.h"

namespace gnmr {

// plan: an int8 plan (impl kInt8, TN). a_codes [plan.a.rows, plan.a.cols] and b_codes
// [plan.b.rows, plan.b.cols] row-major int8 codes; a_scales [m], b_scales [n] their row scales;
// d: column-major m x n, written.
void int8_gemm_reference(const GemmPlan& plan, const std::vector<int8_t>& a_codes,
                         const std::vector<float>& a_scales, const std::vector<int8_t>& b_codes,
                         const std::vector<float>& b_scales, std::vector<float>& d);

}  // namespace gnmr
