// What one path of a projection unit does (docs/DESIGN.md §4): the plain data a precision recipe
// (recipe.h) gives each unit's low and recovery path and the backend executes
// (Backend::projection_forward). Kept apart from recipe.h so the backend does not see the
// config parser. Defined in recipe.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "precision/fp_format.h"
#include "precision/quantize_groupwise.h"

namespace gnmr {

// What one path of a projection unit does to its GEMMs and to the input it saves.
enum class PathKind : uint8_t {
  kBackendGemm,  // GEMMs at the backend's GemmPrecision (train.gemm_precision); input saved as is
  kBf16Gemm,     // every GEMM input rounded to bf16, fp32 accumulation
  kSavedIntGroupwise,  // GEMMs as kBackendGemm; the saved input stored group-wise int (`saved`)
  kFineGrainedFp,      // every GEMM input fake-quantized to `format`: activations and output
                       // gradients in 1 x tile tiles along the reduction dim, weights tile x tile
  kInt8Gemm,           // forward and input-gradient GEMMs: int8 per-token activations / output
                       // gradients and per-output-channel weights; weight-gradient GEMM in bf16
};

const char* path_kind_name(PathKind kind);

struct PathSpec {
  PathKind kind = PathKind::kBackendGemm;
  GroupwiseSpec saved;                // kSavedIntGroupwise
  FpFormat format = FpFormat::kE4M3;  // kFineGrainedFp
  int64_t tile = 128;                 // kFineGrainedFp

  std::string describe() const;  // "saved int4 g128", "fp e4m3 1x128/128x128", "bf16 gemm"
};

// The group spec a unit with input width `cols` uses: `spec` with a group size that divides
// cols (the largest divisor of cols not above spec.group_size).
GroupwiseSpec groupwise_spec_for_width(GroupwiseSpec spec, int64_t cols);

}  // namespace gnmr
