// ProjectionPaths: the per-unit low / recovery switch (docs/DESIGN.md §2 step 2, §4).
// Shapes: x: [N, in]; W: [out, in]; y, dy: [N, out]; dx: [N, in]; N = tokens.
#include "model/projection_paths.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace gnmr {

namespace {

bool needs_prepared_weights(PathKind kind) {
  return kind == PathKind::kBf16Gemm || kind == PathKind::kFineGrainedFp ||
         kind == PathKind::kInt8Gemm;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

ProjectionPaths::ProjectionPaths(const PrecisionRecipe& recipe, Backend& backend,
                                 const ParamTable& table, int64_t tokens)
    : recipe_(recipe), backend_(backend), table_(table), tokens_(tokens) {
  const size_t n_units = table_.units.size();
  plan_.path.assign(n_units, Path::Low);
  saved_input_.resize(n_units);
  packed_.resize(n_units);
  scales_.resize(n_units);
  slots_.resize(table_.params.size());
  const PathSpec* paths[2] = {&recipe_.low, &recipe_.recovery};

  // Packed saved activations: per unit, room for the larger of its two paths.
  std::vector<int64_t> packed_size(n_units, 0), scale_size(n_units, 0);
  int64_t packed_total = 0, scale_total = 0;
  for (const ProjectionUnit& u : table_.units) {
    const int64_t cols = table_.params[static_cast<size_t>(u.param_index)].shape[1];
    for (const PathSpec* path : paths) {
      if (path->kind != PathKind::kSavedIntGroupwise) continue;
      const GroupwiseSpec spec = unit_spec(*path, cols);
      validate_groupwise_spec(cols, spec);
      packed_size[u.id] =
          std::max<int64_t>(packed_size[u.id], round_up(packed_bytes(tokens, cols, spec), 64));
      scale_size[u.id] =
          std::max<int64_t>(scale_size[u.id], round_up(scale_count(tokens, cols, spec), 16));
    }
    packed_total += packed_size[u.id];
    scale_total += scale_size[u.id];
  }
  if (packed_total > 0) {
    packed_storage_ =
        backend_.allocate("saved_packed", {packed_total}, DType::U8, MemoryRole::SavedActivations);
    scale_storage_ =
        backend_.allocate("saved_scales", {scale_total}, DType::F32, MemoryRole::SavedActivations);
    int64_t packed_offset = 0, scale_offset = 0;
    for (const ProjectionUnit& u : table_.units) {
      packed_[u.id] = tensor_view(packed_storage_, {packed_size[u.id]}, packed_offset);
      scales_[u.id] = tensor_view(scale_storage_, {scale_size[u.id]}, scale_offset);
      packed_offset += packed_size[u.id];
      scale_offset += scale_size[u.id];
    }
  }

  // Prepared weights: the projections when a path (or bf16 GEMMs) reads them changed, and
  // the lm_head under bf16 GEMMs. Allocated only when needed: a second copy of the weights.
  bool cache_projections = backend_bf16();
  for (const PathSpec* path : paths) cache_projections |= needs_prepared_weights(path->kind);
  std::vector<int> cached;
  if (cache_projections) {
    for (const ProjectionUnit& u : table_.units) cached.push_back(u.param_index);
  }
  if (backend_bf16()) cached.push_back(table_.lm_head);
  int64_t cache_total = 0;
  for (int index : cached) cache_total += round_up(table_.params[index].weight.numel(), 16);
  if (cache_total > 0) {
    weight_cache_ =
        backend_.allocate("prepared_weights", {cache_total}, DType::F32, MemoryRole::Scratch);
    int64_t offset = 0;
    for (int index : cached) {
      const ParamInfo& p = table_.params[index];
      slots_[index].prepared = tensor_view(weight_cache_, p.shape, offset);
      offset += round_up(p.weight.numel(), 16);
    }
  }

  // GEMM-input scratch: quantized or rounded copies of x and dy, one unit at a time.
  bool needs_scratch = cache_total > 0;
  for (const PathSpec* path : paths) needs_scratch |= path->kind != PathKind::kBackendGemm;
  if (needs_scratch) {
    int64_t widest = 0;
    for (const ProjectionUnit& u : table_.units) {
      const ParamInfo& p = table_.params[static_cast<size_t>(u.param_index)];
      widest = std::max({widest, p.shape[0], p.shape[1]});
    }
    widest = std::max(widest, table_.params[table_.lm_head].shape[1]);  // lm_head input
    gemm_x_ = backend_.allocate("gemm_input_x", {tokens * widest}, DType::F32, MemoryRole::Scratch);
    gemm_dy_ =
        backend_.allocate("gemm_input_dy", {tokens * widest}, DType::F32, MemoryRole::Scratch);
  }
  recompute_stats();
}

const PathSpec& ProjectionPaths::path_of(int id) const {
  if (!recipe_.has_low_path) return recipe_.recovery;
  return plan_.path[static_cast<size_t>(id)] == Path::Low ? recipe_.low : recipe_.recovery;
}

void ProjectionPaths::set_routing(const RoutingPlan& plan) {
  if (plan.path.size() != plan_.path.size()) {
    throw Error(ErrorKind::Runtime, "routing plan has " + std::to_string(plan.path.size()) +
                                        " paths, the model has " +
                                        std::to_string(plan_.path.size()) + " projection units");
  }
  // A unit whose path changed may need its weight prepared differently.
  for (const ProjectionUnit& u : table_.units) {
    if (plan.path[u.id] != plan_.path[u.id]) {
      slots_[static_cast<size_t>(u.param_index)].treatment = Treatment::kNone;
    }
  }
  std::copy(plan.path.begin(), plan.path.end(), plan_.path.begin());
  recompute_stats();
}

void ProjectionPaths::invalidate_weights() {
  for (WeightSlot& slot : slots_) slot.treatment = Treatment::kNone;
}

GroupwiseSpec ProjectionPaths::unit_spec(const PathSpec& path, int64_t cols) const {
  return groupwise_spec_for_width(path.saved, cols);
}

void ProjectionPaths::recompute_stats() {
  const size_t n_units = table_.units.size();
  stats_.units_low = 0;
  stats_.units_recovery = 0;
  stats_.saved_activation_bytes = 0;
  stats_.saved_bytes_per_unit.assign(n_units, 0);
  for (const ProjectionUnit& u : table_.units) {
    const bool low = recipe_.has_low_path && plan_.path[u.id] == Path::Low;
    (low ? stats_.units_low : stats_.units_recovery) += 1;
    const PathSpec& path = path_of(u.id);
    const int64_t cols = table_.params[static_cast<size_t>(u.param_index)].shape[1];
    size_t bytes = static_cast<size_t>(tokens_ * cols) * sizeof(float);
    if (path.kind == PathKind::kSavedIntGroupwise) {
      const GroupwiseSpec spec = unit_spec(path, cols);
      bytes = packed_bytes(tokens_, cols, spec) + scale_count(tokens_, cols, spec) * sizeof(float);
    }
    stats_.saved_bytes_per_unit[u.id] = bytes;
    stats_.saved_activation_bytes += bytes;
  }
}

Tensor ProjectionPaths::scratch(Tensor& buffer, const Tensor& like) const {
  GNMR_CHECK(
      buffer.data != nullptr && like.numel() <= buffer.numel(),
      "projection scratch " + buffer.shape_string() + " too small for " + like.shape_string());
  return tensor_view(buffer, like.shape);
}

const Tensor* ProjectionPaths::prepared_weight(int param_index, Treatment treatment,
                                               FpFormat format, int64_t tile) {
  WeightSlot& slot = slots_[static_cast<size_t>(param_index)];
  if (slot.prepared.data == nullptr) return nullptr;
  if (slot.treatment == treatment && slot.format == format && slot.tile == tile) {
    return &slot.prepared;
  }
  const Tensor& w = table_.params[static_cast<size_t>(param_index)].weight;
  switch (treatment) {
    case Treatment::kBf16:
      backend_.round_to_bf16(w, slot.prepared);
      break;
    case Treatment::kFineGrainedFp:  // DeepSeek-V3: 128 x 128 weight blocks
      backend_.fake_quantize_fp_blockwise(w, slot.prepared, format, tile, tile);
      break;
    case Treatment::kInt8PerRow:  // W: [out, in], one scale per output channel
      backend_.fake_quantize_int8_per_row(w, slot.prepared);
      break;
    case Treatment::kNone:
      return nullptr;
  }
  slot.treatment = treatment;
  slot.format = format;
  slot.tile = tile;
  return &slot.prepared;
}

// ---- the GEMMs of one path ---------------------------------------------------------------

void ProjectionPaths::gemm_forward(int param_index, const PathSpec& path, const Tensor& x,
                                   Tensor& y) {
  const Tensor& w = table_.params[static_cast<size_t>(param_index)].weight;
  PathKind kind = path.kind;
  if (kind == PathKind::kBackendGemm || kind == PathKind::kSavedIntGroupwise) {
    if (!backend_bf16()) {
      backend_.matmul_forward(x, w, y, GemmPrecision::FP32);
      return;
    }
    kind = PathKind::kBf16Gemm;
  }
  const Tensor* wq = nullptr;
  if (kind == PathKind::kBf16Gemm) {
    wq = prepared_weight(param_index, Treatment::kBf16, FpFormat::kE4M3, 0);
    if (wq == nullptr) {  // bf16 GEMMs switched on after construction: no cache
      backend_.matmul_forward(x, w, y, GemmPrecision::BF16);
      return;
    }
  }
  Tensor xq = scratch(gemm_x_, x);
  switch (kind) {
    case PathKind::kBf16Gemm:
      backend_.round_to_bf16(x, xq);
      break;
    case PathKind::kFineGrainedFp:  // activations: 1 x tile along the reduction dim `in`
      wq = prepared_weight(param_index, Treatment::kFineGrainedFp, path.format, path.tile);
      backend_.fake_quantize_fp_blockwise(x, xq, path.format, 1, path.tile);
      break;
    case PathKind::kInt8Gemm:  // per-token activations
      wq = prepared_weight(param_index, Treatment::kInt8PerRow, FpFormat::kE4M3, 0);
      backend_.fake_quantize_int8_per_row(x, xq);
      break;
    default:
      break;
  }
  GNMR_CHECK(wq != nullptr, std::string("no prepared weight for path ") + path_kind_name(kind));
  backend_.matmul_forward(xq, *wq, y, GemmPrecision::FP32);
}

void ProjectionPaths::gemm_backward_input(int param_index, const PathSpec& path, const Tensor& dy,
                                          Tensor& dx, bool accumulate_dx) {
  const Tensor& w = table_.params[static_cast<size_t>(param_index)].weight;
  PathKind kind = path.kind;
  if (kind == PathKind::kBackendGemm || kind == PathKind::kSavedIntGroupwise) {
    if (!backend_bf16()) {
      backend_.matmul_backward_input(dy, w, dx, accumulate_dx, GemmPrecision::FP32);
      return;
    }
    kind = PathKind::kBf16Gemm;
  }
  const Tensor* wq = nullptr;
  if (kind == PathKind::kBf16Gemm) {
    wq = prepared_weight(param_index, Treatment::kBf16, FpFormat::kE4M3, 0);
    if (wq == nullptr) {  // bf16 GEMMs switched on after construction: no cache
      backend_.matmul_backward_input(dy, w, dx, accumulate_dx, GemmPrecision::BF16);
      return;
    }
  }
  Tensor dyq = scratch(gemm_dy_, dy);
  switch (kind) {
    case PathKind::kBf16Gemm:
      backend_.round_to_bf16(dy, dyq);
      break;
    case PathKind::kFineGrainedFp:  // output gradients: 1 x tile along the reduction dim `out`
      wq = prepared_weight(param_index, Treatment::kFineGrainedFp, path.format, path.tile);
      backend_.fake_quantize_fp_blockwise(dy, dyq, path.format, 1, path.tile);
      break;
    case PathKind::kInt8Gemm:  // per-token output gradients, the forward's int8 weight
      wq = prepared_weight(param_index, Treatment::kInt8PerRow, FpFormat::kE4M3, 0);
      backend_.fake_quantize_int8_per_row(dy, dyq);
      break;
    default:
      break;
  }
  GNMR_CHECK(wq != nullptr, std::string("no prepared weight for path ") + path_kind_name(kind));
  backend_.matmul_backward_input(dyq, *wq, dx, accumulate_dx, GemmPrecision::FP32);
}

void ProjectionPaths::gemm_backward_weight(const ProjectionUnit& u, const PathSpec& path,
                                           const Tensor& dy) {
  ParamInfo& p = table_.params[static_cast<size_t>(u.param_index)];
  const Tensor& x = saved_input_[static_cast<size_t>(u.id)];
  const GemmPrecision backend_precision = backend_.gemm_precision();
  switch (path.kind) {
    case PathKind::kBackendGemm:
      backend_.matmul_backward_weight(x, dy, p.grad, backend_precision);
      return;
    case PathKind::kSavedIntGroupwise: {  // the unit's own quantized copy, dequantized
      Tensor xd = scratch(gemm_x_, x);
      backend_.dequantize_int_groupwise(packed_[u.id], scales_[u.id], unit_spec(path, x.dim(1)),
                                        xd);
      backend_.matmul_backward_weight(xd, dy, p.grad, backend_precision);
      return;
    }
    case PathKind::kBf16Gemm:
    case PathKind::kInt8Gemm:  // int8 has per-token scales along this GEMM's reduction (N):
                               // the weight gradient runs in bf16 (SwitchBack, arXiv:2304.13013)
      backend_.matmul_backward_weight(x, dy, p.grad, GemmPrecision::BF16);
      return;
    case PathKind::kFineGrainedFp: {  // both inputs in tile x 1 tiles along the reduction dim N
      Tensor xq = scratch(gemm_x_, x), dyq = scratch(gemm_dy_, dy);
      backend_.fake_quantize_fp_blockwise(x, xq, path.format, path.tile, 1);
      backend_.fake_quantize_fp_blockwise(dy, dyq, path.format, path.tile, 1);
      backend_.matmul_backward_weight(xq, dyq, p.grad, GemmPrecision::FP32);
      return;
    }
  }
}

// ---- the unit seam -------------------------------------------------------------------------

void ProjectionPaths::forward(const ProjectionUnit& u, const Tensor& x, Tensor& y,
                              bool save_for_backward) {
  const PathSpec& path = path_of(u.id);
  gemm_forward(u.param_index, path, x, y);
  if (!save_for_backward) return;
  saved_input_[static_cast<size_t>(u.id)] = x;
  if (path.kind == PathKind::kSavedIntGroupwise) {
    // Each unit quantizes its own copy, so q/k/v (gate/up) sharing x keep their own precision.
    const uint32_t n_units = static_cast<uint32_t>(table_.units.size());
    const RngKey key{recipe_.seed, static_cast<uint32_t>(step_),
                     static_cast<uint32_t>(u.id) + n_units * static_cast<uint32_t>(micro_step_)};
    backend_.quantize_int_groupwise(x, packed_[u.id], scales_[u.id], unit_spec(path, x.dim(1)),
                                    key);
  }
}

void ProjectionPaths::backward(const ProjectionUnit& u, const Tensor& dy, Tensor& dx,
                               bool accumulate_dx) {
  const PathSpec& path = path_of(u.id);
  gemm_backward_weight(u, path, dy);
  gemm_backward_input(u.param_index, path, dy, dx, accumulate_dx);
}

void ProjectionPaths::lm_head_forward(const Tensor& x, Tensor& logits) {
  PathSpec backend_path;  // kBackendGemm: train.gemm_precision, through the cache under bf16
  gemm_forward(table_.lm_head, backend_path, x, logits);
}

void ProjectionPaths::lm_head_backward(const Tensor& x, Tensor& dlogits, Tensor& dx) {
  ParamInfo& p = table_.params[static_cast<size_t>(table_.lm_head)];
  const Tensor* wb = backend_bf16()
                         ? prepared_weight(table_.lm_head, Treatment::kBf16, FpFormat::kE4M3, 0)
                         : nullptr;
  if (wb == nullptr) {
    backend_.matmul_backward(x, p.weight, dlogits, dx, p.grad, /*accumulate_dx=*/false);
    return;
  }
  // dlogits [N, V] is dead after these two GEMMs: round it in place instead of into a copy.
  backend_.round_to_bf16(dlogits, dlogits);
  backend_.matmul_backward_input(dlogits, *wb, dx, false, GemmPrecision::FP32);
  backend_.matmul_backward_weight(x, dlogits, p.grad, GemmPrecision::BF16);
}

}  // namespace gnmr
