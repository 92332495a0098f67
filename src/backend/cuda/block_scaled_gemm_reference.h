// A CPU emulator of cuBLASLt's block-scaled FP8 GEMM as the cuBLAS documentation defines it
// (§3.1.4.5: D = sum over k-blocks of scale_A * scale_B * the block's dot product), reading the
// operands and scales exactly as a GemmPlan lays them out for cuBLASLt (gemm_plan.h,
// precision/scale_layout.h). On the CPU it is checked against the fake-quantize + fp32 GEMM
// path the CPU backend runs; on a GPU it is the oracle of the real FP8 GEMM, so a disagreement
// there points at a layout the GPU code misreads, not at the arithmetic.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/gemm_plan.h"
#include "precision/fp_format.h"

namespace gnmr {

// plan: an FP8 plan (impl kFp8Block). a_codes [plan.a.rows, plan.a.cols] and b_codes
// [plan.b.rows, plan.b.cols] row-major storage codes of `format`; a_scales / b_scales in the
// plan's scale modes; d: column-major m x n, read (beta != 0) and written. Sums in double.
void block_scaled_gemm_reference(const GemmPlan& plan, FpFormat format,
                                 const std::vector<uint8_t>& a_codes,
                                 const std::vector<float>& a_scales,
                                 const std::vector<uint8_t>& b_codes,
                                 const std::vector<float>& b_scales, std::vector<float>& d);

}  // namespace gnmr
