// The CUDA backend's projection op (Backend::plan_projection, projection_forward,
// projection_backward): each GEMM of a path as projection_plan.h says — the operands rounded
// to bf16, quantized to e4m3 codes with cuBLASLt's block scales, fake-quantized into fp32
// (emulated), or restored from the unit's saved codes — then one cuBLASLt matmul. The
// numbers are compared with the CPU backend's emulation (cpu/projection.cpp) in tests/gpu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/op_timer.h"
#include "backend/cuda/projection_plan.h"
#include "backend/shared_saved_input.h"

namespace gnmr {
namespace cuda {

// A prepared weight: the buffer and what it was made from (remade when either changes).
struct PreparedWeight {
  void* data = nullptr;
  float* scales = nullptr;  // fp8 codes: W's scales, then W^T's; int8 codes: one per row
  uint64_t epoch = 0;       // the backend's weights epoch it was made in; 0 = never
  OperandPrep prep = OperandPrep::kAsIs;
  FpFormat format = FpFormat::kE4M3;
  int64_t tile = 0;
};

// The copies of one input that its projections share (ProjectionShape::shared_saved_specs),
// allocated by the leader's plan: packed codes and fp32 scales per shared spec.
struct CudaSharedCodes {
  explicit CudaSharedCodes(std::vector<GroupwiseSpec> specs) : book(std::move(specs)) {}
  SharedSavedInput book;
  std::vector<void*> codes;    // by copy
  std::vector<float*> scales;  // by copy
  size_t planned_bytes = 0;    // all copies, as allocated
};

// x^T's 128x1 codes that an input group's saving forward wrote for its weight gradients
// (forward_keeps_x_t), allocated by the group's leader and shared by its members, with the key
// of what they hold (prepared_input_key for the weight gradient's A).
struct CudaSavedTransposedX {
  struct Copy {
    uint8_t* codes = nullptr;  // [in, N]
    float* scales = nullptr;   // VEC128
    PreparedInputKey holds;
  };
  // One copy (any format: it holds the last keeping forward's), or one per format of the
  // group's two paths where the copies replace x (ProjectionBuffers::saved_x_t_copies).
  int count = 0;
  Copy copies[2];
  size_t bytes_each = 0;  // one copy's codes and scales, as planned
  FpFormat formats[2] = {FpFormat::kE4M3, FpFormat::kE4M3};
  // The copy a path in `format` keeps its codes in (its index, for ProjectionState::group_copy).
  int index_of(FpFormat format) const;
  Copy& of(FpFormat format) { return copies[index_of(format)]; }
};

// x [N, in] rounded to bf16 by an input group's saving forward, which its weight gradients
// read in place of x (kept_copies_replace_x), allocated by the group's leader and shared by its
// members, with the key of what it holds (prepared_input_key: one form for every role).
struct CudaSavedBf16X {
  uint16_t* data = nullptr;
  size_t bytes = 0;  // as planned
  PreparedInputKey holds;
};

class CudaProjectionState final : public ProjectionState {
 public:
  // Where the kept copies replace x, no path's backward reads it (the saved-int path's never).
  bool reads_forward_input(const PathSpec& path) const override {
    return path.kind != PathKind::kSavedIntGroupwise && !copies_replace_x;
  }
  size_t saved_bytes(const PathSpec& path) const override;
  int group_copy(const PathSpec& path) const override;
  size_t planned_saved_bytes() const override {
    return buffers.saved_codes + buffers.saved_scales +
           size_t(buffers.saved_x_t_copies) * (buffers.saved_x_t_codes + buffers.saved_x_t_scales) +
           buffers.saved_x_bf16 +
           (shared != nullptr && shared_member == 0 ? shared->planned_bytes : 0);
  }
  GroupwiseSpec saved_spec(const PathSpec& path) const {
    return groupwise_spec_for_width(path.saved, shape.in);
  }
  // The shared copy `path` keeps its codes in, or -1 (its own buffers, or no codes).
  int shared_copy(const PathSpec& path) const {
    if (shared == nullptr || path.kind != PathKind::kSavedIntGroupwise) return -1;
    return shared->book.copy_of(saved_spec(path));
  }

  ProjectionShape shape;
  GemmPrecision precision = GemmPrecision::FP32;  // the backend's, as planned
  GpuTarget target;
  ProjectionBuffers buffers;
  bool copies_replace_x = false;  // kept_copies_replace_x, as planned
  Tensor saved_input;             // the x the last saving forward read (a view the caller keeps)
  void* saved_codes = nullptr;    // own copy: room for the larger unshared path
  float* saved_scales = nullptr;
  std::shared_ptr<CudaSharedCodes> shared;  // null when the input is not shared
  int shared_member = -1;                   // this projection's index in shared->book
  PreparedWeight weight_bf16, weight_fp8, weight_int8, weight_fake_quant;
  // Its input group (ProjectionShape::input_leader): the leader's state, nullptr when this one
  // leads; in a leader, the generation its last forward started (ProjectionScratch).
  const CudaProjectionState* input_leader = nullptr;
  uint64_t input_generation = 0;
  // The group's kept x^T codes (the leader's allocation); null when its paths keep none.
  std::shared_ptr<CudaSavedTransposedX> saved_x_t;
  // The group's kept bf16 x (the leader's allocation); null when it keeps none.
  std::shared_ptr<CudaSavedBf16X> saved_x_bf16;
  // x-side preparations this projection ran, and those it found already in the scratch or the
  // kept bf16 copy; its weight gradients that read x^T's codes or the bf16 copy kept by the
  // group's forward; its forwards whose x
  // the kernel making its operand computed (ComputedX); its backwards whose dy codes were
  // computed from what dy is made of (ComputedDy); and its FP8 weights that prepare_weights
  // quantized in a batch.
  int64_t x_prepared = 0, x_reused = 0, x_t_kept_reads = 0, x_bf16_kept_reads = 0;
  int64_t computed_x_forwards = 0, computed_dy_backwards = 0, weights_prepared_in_batch = 0;
};

// The projections' shared scratch (one projection runs at a time), sized by planning.
struct ProjectionScratch {
  DeviceScratch x_f32{"projection.x_f32"}, x_low{"projection.x_low"},
      x_scales{"projection.x_scales"};
  DeviceScratch dy_f32{"projection.dy_f32"}, dy_low{"projection.dy_low"},
      dy_scales{"projection.dy_scales"};
  PreparedInputKey x_low_holds;  // what x_low and x_scales hold (projection_plan.h)
  uint64_t group_forwards = 0;   // forwards of group leaders so far: their generations
};

// Everything a call needs from the backend.
struct ProjectionContext {
  DeviceMemory& memory;
  ProjectionScratch& scratch;
  LtGemmRunner& gemm;
  OpTimer& timer;  // the breakdown's "gemm" and "prep ..." (one per operand) spans
  cudaStream_t stream;
  GemmPrecision precision;
  GpuTarget target;
  uint64_t weights_epoch;
};

// A backward's dy whose one form the kernel of the op producing it makes: computed from what dy
// is made of, dy never written in fp32 (the SwiGLU backward's dgate or dup of gate, up and dout;
// RoPE's backward of q's or k's unrotated gradient; the loss's gradient of the logits), or
// written beside dy (the RMSNorm backward's residual gradient). One member per form the
// producer can make, empty where it cannot. Only a path whose dy takes one form for both of its
// GEMMs (DyPreparation::kFp8BothOnce or kBf16Once, backward_dy_preparation_of) in an offered
// form takes one, and calls the member for that form with the dy scratch:
struct ComputedDy {
  // DyPreparation::kFp8BothOnce: dy's 1x128 codes and dy^T's 128x1 codes in the path's format,
  // as quantize_fp_tile_1x128_and_transposed would write them from dy.
  std::function<void(FpFormat format, uint8_t* codes, float* scales, uint8_t* codes_t,
                     float* scales_t)>
      fp8_pair;
  // DyPreparation::kBf16Once: dy rounded to bf16 [N, out], as convert_to_bf16 would write it.
  std::function<void(uint16_t* bf16)> bf16;
};

// A forward's x that the kernel preparing it computes and writes, x [N, in] itself included:
// the SwiGLU forward's silu(gate) * up (swiglu_projection_forward) or the residual RMSNorm's
// output (residual_rmsnorm_projection_forward). One member per form of x the producer can make
// in its pass, empty where it cannot; only a forward that prepares x in an offered form takes
// one (forward_takes_computed_x), and calls that member with the x scratch or kept copy:
struct ComputedX {
  // x and its bf16 rounding [N, in], as convert_to_bf16 would write it from x
  // (swiglu_forward_with_bf16, residual_rmsnorm_forward with out_bf16).
  std::function<void(uint16_t* bf16)> bf16;
  // x and its 1x128 codes and x^T's 128x1 codes in `format`, as
  // quantize_fp_tile_1x128_and_transposed would write them from x
  // (quantize_swiglu_output_1x128_and_transposed); offered only in a format and on arrays the
  // fused pair kernel takes (fused_pair_takes).
  std::function<void(FpFormat format, uint8_t* codes, float* scales, uint8_t* codes_t,
                     float* scales_t)>
      fp8_pair;
};

std::unique_ptr<CudaProjectionState> plan_projection(const ProjectionContext& c,
                                                     const std::string& name,
                                                     const ProjectionShape& shape,
                                                     const PathSpec& low, const PathSpec& recovery);
// One projection's weight as prepare_weights takes it (Backend::prepare_projection_weights).
struct WeightToPrepare {
  CudaProjectionState& state;
  const PathSpec& path;
  const Tensor& w;
};
// Quantizes the weights among these whose paths' GEMMs read W's FP8 128x128 codes and whose
// codes this weights epoch has not yet made, all of them in a few launches
// (quantize_fp_block_128x128_batch), where each one's first GEMM would otherwise run a launch
// of its own; the same codes, so the GEMMs find them made. Other preparations (bf16, int8,
// fake-quantized) stay with the first GEMM that reads them.
void prepare_weights(const ProjectionContext& c, const std::vector<WeightToPrepare>& weights);
// computed_x: x is written by the kernel that prepares its operand (forward_takes_computed_x).
void projection_forward(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                        const Tensor& w, const Tensor& x, Tensor& y, bool save, const RngKey& key,
                        const ComputedX* computed_x = nullptr);
// Whether projection_forward on `path` takes `from` as its x: a forward of a projection that
// leads its input (so it prepares x, never finds it made) that rounds x to bf16, where `from`
// offers bf16, or a saving one that keeps x^T's codes (forward_keeps_x_t: x's FP8 codes and
// x^T's from one kernel), where it offers the FP8 pair.
bool forward_takes_computed_x(const ProjectionContext& c, const CudaProjectionState& s,
                              const PathSpec& path, bool save, const ComputedX& from);
// computed_dy: dy's codes come from it, dy itself (then only its shape is read) is not read.
void projection_backward(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                         const Tensor& w, Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dw,
                         const ComputedDy* computed_dy = nullptr);
// How projection_backward on `path` prepares dy (projection_plan.h). With kFp8BothOnce or
// kBf16Once both GEMMs read one form of dy, so dy itself is read by nothing else: the backward
// takes a ComputedDy.
DyPreparation backward_dy_preparation_of(const ProjectionContext& c, const CudaProjectionState& s,
                                         const PathSpec& path, bool accumulate_dx);

}  // namespace cuda
}  // namespace gnmr
