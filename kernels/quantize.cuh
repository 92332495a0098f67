// Host API of the quantization kernels. All pointers are device pointers; work is queued on
// `stream` and errors surface through GNMR_CUDA_CHECK (kernels/cuda_check.cuh). Plain C++:
// a .cpp file can include this and link gnmr_kernels.
// Each function is the CUDA twin of the CPU function of the same name in src/precision and
// writes the same bytes (both call the shared host+device per-element functions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "precision/counter_rng.h"
#include "precision/fp_format.h"
#include "precision/quantize_groupwise.h"

namespace gnmr::cuda {

// x: [rows, cols] fp32 -> packed: [rows, packed_row_bytes(cols, bits)], scales:
// [scale_count(rows, cols, spec)] fp32. Twin: gnmr::quantize_int_groupwise
// (src/precision/quantize_groupwise.h). Any bits in 2..8; throws a Config error for a bad spec.
void quantize_int_groupwise(const float* x, int64_t rows, int64_t cols, const GroupwiseSpec& spec,
                            uint8_t* packed, float* scales, RngKey key, cudaStream_t stream);

// packed + scales -> out: [rows, cols] fp32. Twin: gnmr::dequantize_int_groupwise.
void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                              int64_t cols, const GroupwiseSpec& spec, float* out,
                              cudaStream_t stream);

// Where a scale goes: the CPU's row-major tile grid, or cuBLASLt's VEC128 order (row fastest,
// precision/scale_layout.h), the one its block-scaled FP8 GEMM reads.
enum class ScaleOrder { kCpu, kVec128 };

// x: [rows, cols] fp32 -> codes: [rows, cols] storage codes of `format` (e4m3 codes for the
// fp6 / fp4 formats), scales: rows * ceil(cols / 128) fp32 in `order`.
// Twin: gnmr::quantize_fp_tile_1x128 (src/precision/quantize_fine_grained.h), whose scales
// are in ScaleOrder::kCpu; vec128_from_row_tiles reorders them.
void quantize_fp_tile_1x128(const float* x, int64_t rows, int64_t cols, FpFormat format,
                            ScaleOrder order, uint8_t* codes, float* scales, cudaStream_t stream);

}  // namespace gnmr::cuda
