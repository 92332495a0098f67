// Host API of the quantization kernels. All pointers are device pointers; work is queued on
// `stream` and errors surface through GNMR_CUDA_CHECK (kernels/cuda_check.cuh). Plain C++:
// a .cpp file can include this and link gnmr_kernels.
// Each function names its CPU twin in src/precision and writes the same bytes (both call the
// shared host+device per-element functions); the gpu tests (tests/gpu) compare them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

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
// The same values rounded to bf16 as they are written (a bf16 GEMM's operand): the bits of
// dequantize_int_groupwise then convert_to_bf16, in one pass. Twin: encode_bf16 of each of
// gnmr::dequantize_int_groupwise's floats.
void dequantize_int_groupwise_to_bf16(const uint8_t* packed, const float* scales, int64_t rows,
                                      int64_t cols, const GroupwiseSpec& spec, uint16_t* out,
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

// w: [rows, cols] fp32 -> codes [rows, cols] and scales (blk128_scale_count(rows, cols), the
// BLK128x128 order); when codes_t / scales_t are not null also the codes of W^T [cols, rows]
// and its scales (blk128_scale_count(cols, rows)). Padding scales are zero.
// Twin: gnmr::quantize_fp_block_128x128 + blk128_from_blocks (transposed for W^T).
void quantize_fp_block_128x128(const float* w, int64_t rows, int64_t cols, FpFormat format,
                               uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                               cudaStream_t stream);
// One weight of quantize_fp_block_128x128_batch: quantize_fp_block_128x128's arguments.
struct FpBlock128x128Weight {
  const float* w;
  int64_t rows, cols;
  FpFormat format;
  uint8_t* codes;
  float* scales;
  uint8_t* codes_t;  // null: no W^T (then scales_t is not written)
  float* scales_t;
};
// quantize_fp_block_128x128 of each weight, the same bytes, in one launch per format and
// access width for up to 48 weights (the CUDA backend's prepare_projection_weights: a step's
// FP8 weights in a few launches).
void quantize_fp_block_128x128_batch(const std::vector<FpBlock128x128Weight>& weights,
                                     cudaStream_t stream);

// x: [n, cols] fp32 -> codes_t: [cols, n] (x^T, quantized in 128 x 1 tiles along n), scales:
// vec128_scale_count(cols, n) in VEC128 order. Twin: gnmr::quantize_fp_blockwise(x, n, cols,
// 128, 1, ...) with its codes transposed.
void quantize_fp_tile_128x1_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                       uint8_t* codes_t, float* scales, cudaStream_t stream);

// Both of the above from one read of x [n, cols]: codes [n, cols] with scales
// (vec128_scale_count(n, cols)) as quantize_fp_tile_1x128 writes them in ScaleOrder::kVec128,
// and codes_t [cols, n] with scales_t (vec128_scale_count(cols, n)) as
// quantize_fp_tile_128x1_transposed writes them. Twins: those two's.
void quantize_fp_tile_1x128_and_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                           uint8_t* codes, float* scales, uint8_t* codes_t,
                                           float* scales_t, cudaStream_t stream);

// Whether the fused pair kernels below (the pair kernel computing its input from what it is
// made of) take a call: a format with FP8 GEMMs (not e5m2), rows of `cols` a multiple of 4
// floats and every float array 16-byte aligned (they have only the four-wide accesses; an FP8
// GEMM's operands always are; the codes 4-byte aligned). They throw a Runtime error elsewhere.
bool fused_pair_takes(FpFormat format, int64_t cols, std::initializer_list<const void*> arrays);

// The same two operands of a SwiGLU backward output that is never written: dgate (kGate) or
// dup (kUp) of gate, up, dout [n, cols], computed as swiglu_backward computes them
// (backend/train_math.h), then quantized as above (dup reads no up). The fused MLP backward's
// dy (Backend::swiglu_projections_backward). Twins: cpu::swiglu_backward, then
// quantize_fp_tile_1x128_and_transposed's.
enum class SwigluGradient { kGate, kUp };
void quantize_swiglu_gradient_1x128_and_transposed(const float* gate, const float* up,
                                                   const float* dout, SwigluGradient which,
                                                   int64_t n, int64_t cols, FpFormat format,
                                                   uint8_t* codes, float* scales, uint8_t* codes_t,
                                                   float* scales_t, cudaStream_t stream);
// The SwiGLU forward's out = silu(gate) * up [n, cols] (as swiglu_forward computes and writes
// it), quantized in the same pass as quantize_fp_tile_1x128_and_transposed quantizes x: the
// MLP's down projection's forward operands (Backend::swiglu_projection_forward). Twins:
// cpu::swiglu_forward, then quantize_fp_tile_1x128_and_transposed's.
void quantize_swiglu_output_1x128_and_transposed(const float* gate, const float* up, float* out,
                                                 int64_t n, int64_t cols, FpFormat format,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, cudaStream_t stream);

// q's or k's dy: RoPE's backward (rope_backward's transposed rotation) of dx [n, heads x hd],
// token r at position r % seq of the tables cos, sin [>= seq, hd / 2], quantized as
// quantize_fp_tile_1x128_and_transposed quantizes x, dx never written (the fused attention
// backward, Backend::rope_projection_backward). Twins: cpu::rope_backward, then
// quantize_fp_tile_1x128_and_transposed's. rope_gradient_quantizable: whether it takes hd and
// the tables (head dim 64 or 128, so each 128-column tile holds whole heads; the tables 16-byte
// aligned); with fused_pair_takes, whether the call is taken.
bool rope_gradient_quantizable(int64_t hd, const float* cos, const float* sin);
void quantize_rope_gradient_1x128_and_transposed(const float* dx, const float* cos,
                                                 const float* sin, int64_t n, int64_t seq,
                                                 int64_t heads, int64_t hd, FpFormat format,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, cudaStream_t stream);

// The check of kernels/fp_storage_conversion.cuh: the 32-bit patterns first + stride * i
// (i < count, mod 2^32) as quotients, coded by the conversion instructions and by the codec.
// For the formats that have the instructions (e4m3, e3m2, e2m3; an error for the others).
// Synchronous (default stream). A test's tool, not a training op.
struct FpConversionCheck {
  uint64_t differences = 0;
  uint32_t first_difference_bits = 0;  // the lowest i's pattern, where differences > 0
};
FpConversionCheck check_fp_storage_conversion(FpFormat format, uint64_t first, uint64_t stride,
                                              uint64_t count);

// x: [count] fp32 -> out: [count] bf16 bits. Twin: gnmr::encode_bf16 (src/precision/bf16.h).
void convert_to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream);

// x, out: [rows, cols] fp32 (out may be x). Twin: gnmr::fake_quantize_int_per_row(..., 8, ...).
void fake_quantize_int8_per_row(const float* x, int64_t rows, int64_t cols, float* out,
                                cudaStream_t stream);

// The int8 GEMM's epilogue, in place: d holds the int32 sums of a column-major m x n D as
// cuBLASLt wrote them and receives their fp32 values; a_scales [m], b_scales [n] are the two
// operands' row scales. Twin: gnmr::int8_gemm_reference (backend/cuda/int8_gemm_reference.h).
void dequantize_int8_gemm_output(void* d, const float* a_scales, const float* b_scales, int64_t m,
                                 int64_t n, cudaStream_t stream);

}  // namespace gnmr::cuda
