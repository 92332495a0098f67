// The CPU backend's projection op (Backend::plan_projection, projection_forward,
// projection_backward): every PathKind emulated in fp32 — the GEMM inputs rounded to bf16 or
// fake-quantized into fp32 scratch, then an fp32 GEMM — so the numbers are the reference a
// backend with real bf16 / fp8 / int8 operands is compared against. One executor per PathKind
// in projection.cpp; each composes the backend's own ops (quantize.cpp, matmul.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/shared_saved_input.h"

namespace gnmr {
namespace cpu {

// How a prepared weight was made from the master weight.
enum class WeightTreatment : uint8_t { kBf16, kFineGrainedFp, kInt8PerRow };

// The copies of one input that its projections share (ProjectionShape::shared_saved_specs),
// allocated by the leader's plan: packed codes and fp32 scales per shared spec.
struct CpuSharedCodes {
  explicit CpuSharedCodes(std::vector<GroupwiseSpec> specs) : book(std::move(specs)) {}
  SharedSavedInput book;
  std::vector<Tensor> packed, scales;  // by copy
};

class CpuProjectionState final : public ProjectionState {
 public:
  // The weight gradient reads the fp32 input unless the path keeps codes.
  bool reads_forward_input(const PathSpec& path) const override;
  // Packed codes + fp32 scales on kSavedIntGroupwise (own or shared), else 0.
  size_t saved_bytes(const PathSpec& path) const override;
  size_t planned_saved_bytes() const override;
  GroupwiseSpec saved_spec(const PathSpec& path) const;  // path.saved for a row of `in` values
  // The shared copy `path` keeps its codes in, or -1 (its own buffers, or no codes).
  int shared_copy(const PathSpec& path) const;

  ProjectionShape shape;
  Tensor saved_input;     // the x the last saving forward read (a view the caller keeps)
  Tensor packed, scales;  // own saved codes: room for the larger unshared path; else empty
  std::shared_ptr<CpuSharedCodes> shared;  // null when the input is not shared
  int shared_member = -1;                  // this projection's index in shared->book
  // The weight as this step's GEMMs read it, [out, in]; empty when no path needs one.
  Tensor prepared;
  WeightTreatment treatment = WeightTreatment::kBf16;
  FpFormat format = FpFormat::kE4M3;
  int64_t tile = 0;
  uint64_t prepared_epoch = 0;  // the backend's weights epoch it was made in; 0 = never
  // Elements of the backend's shared projection scratch this projection uses.
  int64_t x_scratch = 0, dy_scratch = 0;
};

// The backend's projection scratch, shared by all projections (one runs at a time):
// quantized or rounded copies of x [N, in] and dy [N, out].
struct ProjectionScratch {
  float* x = nullptr;
  int64_t x_capacity = 0;
  float* dy = nullptr;
  int64_t dy_capacity = 0;
};

// Allocates on `be` what either path needs (saved codes, the prepared weight; the prepared
// weight also when `be` runs bf16 GEMMs now) and says how much scratch the calls will use.
std::unique_ptr<CpuProjectionState> plan_projection(Backend& be, const std::string& name,
                                                    const ProjectionShape& shape,
                                                    const PathSpec& low, const PathSpec& recovery);

// A call's context: `weights_epoch` changes whenever the backend's prepared weights are
// invalidated.
struct ProjectionCall {
  Backend& be;
  CpuProjectionState& state;
  const Tensor& w;
  ProjectionScratch scratch;
  uint64_t weights_epoch;
};

void projection_forward(const ProjectionCall& call, const PathSpec& path, const Tensor& x,
                        Tensor& y, bool save, const RngKey& key);
void projection_backward(const ProjectionCall& call, const PathSpec& path, Tensor& dy, Tensor& dx,
                         bool accumulate_dx, Tensor& dw);

}  // namespace cpu
}  // namespace gnmr
