// How the CUDA backend executes one projection (docs/DESIGN.md §6): for each GEMM of a path,
// the cuBLASLt plan (gemm_plan.h) and how each of its two operands is prepared before
// cuBLASLt reads it; and, for a projection's two paths, the buffers that preparation needs.
// Plain host functions, so every rule is tested on a machine without a GPU; the backend
// (cuda_backend.cpp) only allocates what this says and calls the kernels it names.
//
// Operand sides: the forward GEMM reads the weight side (A) and the x side (B); the input
// gradient the weight side (A) and the dy side (B); the weight gradient the x side (A) and the
// dy side (B).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gemm_plan.h"

namespace gnmr {

// What is done to a tensor before the GEMM reads it.
enum class OperandPrep : uint8_t {
  kAsIs,             // the fp32 tensor the model holds
  kBf16,             // rounded to bf16 storage (the weight: its prepared copy)
  kFp8Codes,         // e4m3 codes with fp32 block scales in the plan's scale order
  kInt8Codes,        // int8 codes with one fp32 scale per row (int group-wise, 8 bits, a row)
  kFakeQuantFp,      // fake-quantized to the path's format in fp32 (an emulated GEMM)
  kFakeQuantInt8,    // int8 fake quantization with one scale per row, in fp32 (emulated)
  kDequantized,      // the unit's saved group-wise int codes restored to fp32
  kDequantizedBf16,  // restored to fp32, then rounded to bf16 storage
};

const char* operand_prep_name(OperandPrep prep);

struct ProjectionGemm {
  GemmPlan plan;
  OperandPrep a = OperandPrep::kAsIs, b = OperandPrep::kAsIs;
};

// One GEMM of a projection on `path`. accumulate: the input gradient adds into dx (the weight
// gradient always accumulates).
ProjectionGemm plan_projection_gemm(GemmRole role, const ProjectionShape& shape,
                                    const PathSpec& path, GemmPrecision backend_precision,
                                    const GpuTarget& target, bool accumulate);

// Backend::describe_projection on the GPU: the implementation of each GEMM of `path`, one name
// when the three agree, with the reason where a GEMM runs emulated.
std::string describe_projection_gemms(const ProjectionShape& shape, const PathSpec& path,
                                      GemmPrecision backend_precision, const GpuTarget& target);

// What the x-side scratch (x_low with x_scales) holds: one preparation of one x. A call
// finding the key of the preparation it needs may read the scratch as it is (the projections
// of one input group, ProjectionShape::input_leader): the same group in the same generation
// (the leader's forwards so far), the same x, prepared the same way.
struct PreparedInputKey {
  const void* group = nullptr;  // the group leader's state; nullptr: shared with no call
  uint64_t generation = 0;
  const void* x = nullptr;
  OperandPrep prep = OperandPrep::kAsIs;
  FpFormat format = FpFormat::kE4M3;  // kFp8Codes: the codes' format
  bool transposed = false;            // kFp8Codes: the weight gradient's 128x1 tiles of x^T
};

// The key of preparing x as `prep` for `role` on `path`. Only the preparations that write
// x_low from x alone are shared: bf16 (the same bits for every role), fp8 codes (per format
// and orientation) and the forward's int8 codes. Every other one gets a key with no group.
PreparedInputKey prepared_input_key(const void* group, uint64_t generation, const void* x,
                                    OperandPrep prep, GemmRole role, const PathSpec& path);
// Whether a scratch holding `held` holds what `wanted` needs; never for a key with no group.
bool same_prepared_input(const PreparedInputKey& held, const PreparedInputKey& wanted);

// How the backward prepares dy for its two GEMMs (the weight gradient's runs first).
enum class DyPreparation : uint8_t {
  kPerGemm,      // each GEMM its own, one after the other in the dy-side scratch
  kBf16Once,     // both round dy to bf16, the same bits: the input gradient reads the weight
                 // gradient's copy (which writes only dW in between)
  kFp8BothOnce,  // both read FP8 codes: one kernel writes dy^T's 128x1 codes and dy's 1x128
                 // codes from one read of dy (quantize_fp_tile_1x128_and_transposed)
};
DyPreparation backward_dy_preparation(const ProjectionGemm& weight_gradient,
                                      const ProjectionGemm& input_gradient);

// Whether a saving forward on `forward`'s path also writes x^T's 128x1 codes for its backward:
// both the forward's B and the weight gradient's A are FP8 codes of x (in the path's format),
// so one read of x gives both (quantize_fp_tile_1x128_and_transposed, as dy's pair), kept in the
// input group's saved copy until the weight gradient reads them, instead of x being read and
// quantized again in the backward.
bool forward_keeps_x_t(const ProjectionGemm& forward, const ProjectionGemm& weight_gradient);

// Whether both the forward's B and the weight gradient's A are x rounded to bf16: one rounding
// serves both, and the forward may keep it for the backward.
bool forward_keeps_x_bf16(const ProjectionGemm& forward, const ProjectionGemm& weight_gradient);

// What a saving forward on `path` can keep of x for its weight gradient: x^T's FP8 codes
// (forward_keeps_x_t), x's bf16 rounding (forward_keeps_x_bf16), or nothing.
enum class KeptX { kNone, kTransposedCodes, kBf16 };
KeptX kept_x_of(const ProjectionShape& shape, const PathSpec& path, GemmPrecision backend_precision,
                const GpuTarget& target);

// Whether the copies a projection's saving forwards keep replace x: on every path the backward
// reads a kept copy (KeptX) or its saved-int codes, never x, one path at least keeps a copy,
// and the model does not keep x for another reason (input_read_elsewhere). Then the backward
// does not read x (Backend's reads_forward_input), so the model keeps no fp32 x for the input
// (4 bytes an element; a copy is 1 or 2), the input group keeps one x^T copy per FP8 format of
// its paths (fp8mix's low and recovery formats: GNMR may route q, k, v to different ones), and
// the bf16 copy is kept at all only here.
bool kept_copies_replace_x(const ProjectionShape& shape, const PathSpec& low,
                           const PathSpec& recovery, GemmPrecision backend_precision,
                           const GpuTarget& target);

// Where kFp8BothOnce puts its two operands in the dy-side scratch: byte offsets into dy_low
// (codes) and dy_scales (scales), each on a 256-byte boundary, and the bytes each holds in all.
struct Fp8DyPairLayout {
  size_t codes_t = 0, codes = 0, codes_bytes = 0;     // dy^T [out, N]; dy [N, out]
  size_t scales_t = 0, scales = 0, scales_bytes = 0;  // their VEC128 scales
};
Fp8DyPairLayout fp8_dy_pair_layout(int64_t tokens, int64_t out);

// What a projection's two paths need, in bytes. Prepared weights are per projection and live
// across micro-steps (remade after invalidate_prepared_weights); the x-side and dy-side
// scratch is shared by all projections (one runs at a time), so the backend keeps the largest.
struct ProjectionBuffers {
  size_t weight_bf16 = 0;                        // W [out, in] in bf16
  size_t weight_fp8_codes = 0;                   // W [out, in] and W^T [in, out] e4m3 codes
  size_t weight_fp8_scales = 0;                  // their BLK128x128 scales (padding included)
  size_t weight_fake_quant = 0;                  // W [out, in] fake-quantized, fp32
  size_t weight_int8_codes = 0;                  // W [out, in] int8 codes
  size_t weight_int8_scales = 0;                 // their scales, one per output channel
  size_t x_f32 = 0, x_low = 0, x_scales = 0;     // x side: fp32 copy, bf16 / codes, scales
  size_t dy_f32 = 0, dy_low = 0, dy_scales = 0;  // dy side
  // kSavedIntGroupwise: the larger path's own copy (paths whose spec is not shared)
  size_t saved_codes = 0, saved_scales = 0;
  // The shared copies (ProjectionShape::shared_saved_specs), one per spec, when this is
  // their leader; empty otherwise.
  std::vector<size_t> shared_codes, shared_scales;
  // forward_keeps_x_t on either path, when this projection leads its input (no input_leader):
  // x^T's 128x1 codes [in, N] and their VEC128 scales, kept from the forward for the group's
  // weight gradients: bytes of one copy, and the copies (one per format where they replace x,
  // kept_copies_replace_x; else one, holding the last keeping forward's format).
  size_t saved_x_t_codes = 0, saved_x_t_scales = 0;
  int saved_x_t_copies = 0;
  // The paths' formats of those copies, copy by copy, where there are two.
  FpFormat saved_x_t_formats[2] = {FpFormat::kE4M3, FpFormat::kE4M3};
  // Where the copies replace x and a path keeps x's bf16 rounding, when this projection leads
  // its input: x [N, in] in bf16.
  size_t saved_x_bf16 = 0;
};

// Both paths' three GEMMs (accumulating or not changes no buffer). A path whose saved spec is
// in shape.shared_saved_specs keeps its codes in the shared copies, not its own.
ProjectionBuffers projection_buffers(const ProjectionShape& shape, const PathSpec& low,
                                     const PathSpec& recovery, GemmPrecision backend_precision,
                                     const GpuTarget& target);

}  // namespace gnmr
