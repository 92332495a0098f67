// The int8 GEMM's output (backend/cuda/gemm_plan.h, recipe int8's forward): element (i, j) of
// D = op(A) op(B) with A's row i quantized as codes times scale_a[i] and B's row j as codes
// times scale_b[j] is scale_a[i] * scale_b[j] * (the exact int32 sum of code products).
// Shared by the CUDA kernel that scales cuBLASLt's int32 sums in place
// (kernels/dequantize_int8_gemm_output.cu) and its CPU twin (backend/cuda/int8_gemm_reference.h),
// so the two give the same bits: the sum is exact on both, and this is the only rounding.
// Relative error against the exact product of the dequantized values: at most three roundings
// (the sum to fp32, then two products), 3 * 2^-24, whatever the cancellation inside the sum.
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

GNMR_HD_INLINE float int8_gemm_output(int32_t sum, float scale_a, float scale_b) {
  return canonical_nan(static_cast<float>(sum) * scale_a * scale_b);
}

}  // namespace gnmr
