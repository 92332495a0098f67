// The CPU projection executors, one per PathKind (src/precision/path_spec.h), and their
// planning. Shapes: x: [N, in]; W: [out, in]; y, dy: [N, out]; dx: [N, in]; N = tokens.
// The backward runs the weight gradient first, then the input gradient (the last reader of
// dy, which it may overwrite when the shape allows it).
#include "backend/cpu/projection.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace gnmr {
namespace cpu {

namespace {

bool needs_prepared_weight(PathKind kind) {
  return kind == PathKind::kBf16Gemm || kind == PathKind::kFineGrainedFp ||
         kind == PathKind::kInt8Gemm;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

bool bf16_gemms(const ProjectionCall& c) {
  return c.be.gemm_precision() == GemmPrecision::BF16;
}

// A view of the shared scratch shaped as `like`.
Tensor scratch_view(float* data, int64_t capacity, const Tensor& like) {
  GNMR_CHECK(data != nullptr && like.numel() <= capacity,
             "projection scratch of " + std::to_string(capacity) + " values too small for " +
                 like.shape_string());
  Tensor view;
  view.data = data;
  view.shape = like.shape;
  return view;
}
Tensor x_scratch(const ProjectionCall& c, const Tensor& like) {
  return scratch_view(c.scratch.x, c.scratch.x_capacity, like);
}
Tensor dy_scratch(const ProjectionCall& c, const Tensor& like) {
  return scratch_view(c.scratch.dy, c.scratch.dy_capacity, like);
}
// Where the input gradient's quantized dy goes: dy itself when the caller allows it.
Tensor input_grad_dy(const ProjectionCall& c, Tensor& dy) {
  return c.state.shape.backward_may_overwrite_dy ? dy : dy_scratch(c, dy);
}

// The weight as a GEMM of this treatment reads it, made on first use after an invalidation
// and reused by every micro-step's forward and input-gradient GEMMs. nullptr when none was
// planned (bf16 GEMMs switched on after planning).
const Tensor* prepared_weight(const ProjectionCall& c, WeightTreatment treatment, FpFormat format,
                              int64_t tile) {
  CpuProjectionState& s = c.state;
  if (s.prepared.data == nullptr) return nullptr;
  if (s.prepared_epoch == c.weights_epoch && s.treatment == treatment && s.format == format &&
      s.tile == tile) {
    return &s.prepared;
  }
  switch (treatment) {
    case WeightTreatment::kBf16:
      c.be.round_to_bf16(c.w, s.prepared);
      break;
    case WeightTreatment::kFineGrainedFp:  // DeepSeek-V3: tile x tile weight blocks
      c.be.fake_quantize_fp_blockwise(c.w, s.prepared, format, tile, tile);
      break;
    case WeightTreatment::kInt8PerRow:  // W: [out, in], one scale per output channel
      c.be.fake_quantize_int8_per_row(c.w, s.prepared);
      break;
  }
  s.prepared_epoch = c.weights_epoch;
  s.treatment = treatment;
  s.format = format;
  s.tile = tile;
  return &s.prepared;
}

const Tensor& required(const Tensor* prepared, const PathSpec& path) {
  GNMR_CHECK(prepared != nullptr,
             std::string("no prepared weight for path ") + path_kind_name(path.kind));
  return *prepared;
}

// ---- kBf16Gemm: every GEMM input rounded to bf16, fp32 accumulation ----------------------

void bf16_forward(const ProjectionCall& c, const Tensor& x, Tensor& y) {
  const Tensor* wq = prepared_weight(c, WeightTreatment::kBf16, FpFormat::kE4M3, 0);
  if (wq == nullptr) {  // the backend rounds both inputs on every call
    c.be.matmul_forward(x, c.w, y, GemmPrecision::BF16);
    return;
  }
  Tensor xq = x_scratch(c, x);
  c.be.round_to_bf16(x, xq);
  c.be.matmul_forward(xq, *wq, y, GemmPrecision::FP32);
}
void bf16_input_grad(const ProjectionCall& c, Tensor& dy, Tensor& dx, bool accumulate) {
  const Tensor* wq = prepared_weight(c, WeightTreatment::kBf16, FpFormat::kE4M3, 0);
  if (wq == nullptr) {
    c.be.matmul_backward_input(dy, c.w, dx, accumulate, GemmPrecision::BF16);
    return;
  }
  Tensor dyq = input_grad_dy(c, dy);
  c.be.round_to_bf16(dy, dyq);
  c.be.matmul_backward_input(dyq, *wq, dx, accumulate, GemmPrecision::FP32);
}
void bf16_weight_grad(const ProjectionCall& c, const Tensor& x, const Tensor& dy, Tensor& dw) {
  c.be.matmul_backward_weight(x, dy, dw, GemmPrecision::BF16);
}

// ---- kBackendGemm: the GEMMs at the backend's GemmPrecision ------------------------------
// Under bf16 GEMMs the forward and input gradient go through the bf16-prepared weight.

void backend_gemm_forward(const ProjectionCall& c, const Tensor& x, Tensor& y) {
  if (bf16_gemms(c)) {
    bf16_forward(c, x, y);
    return;
  }
  c.be.matmul_forward(x, c.w, y, GemmPrecision::FP32);
}
void backend_gemm_input_grad(const ProjectionCall& c, Tensor& dy, Tensor& dx, bool accumulate) {
  if (bf16_gemms(c)) {
    bf16_input_grad(c, dy, dx, accumulate);
    return;
  }
  c.be.matmul_backward_input(dy, c.w, dx, accumulate, GemmPrecision::FP32);
}
void backend_gemm_weight_grad(const ProjectionCall& c, const Tensor& x, const Tensor& dy,
                              Tensor& dw) {
  c.be.matmul_backward_weight(x, dy, dw, c.be.gemm_precision());
}

// ---- kSavedIntGroupwise: GEMMs as kBackendGemm; the weight gradient reads a group-wise
// int copy of x: the unit's own, or the one it shares with the units of its input that save
// it with the same deterministic spec (shared_saved_input.h) --------------------------------

void saved_int_save(const ProjectionCall& c, const PathSpec& path, const Tensor& x,
                    const RngKey& key) {
  CpuProjectionState& s = c.state;
  const int copy = s.shared_copy(path);
  if (s.shared != nullptr && s.shared->book.save(s.shared_member, copy, x.data)) {
    const size_t i = static_cast<size_t>(copy);
    c.be.quantize_int_groupwise(x, s.shared->packed[i], s.shared->scales[i], s.saved_spec(path),
                                key);
  }
  if (copy >= 0 || path.kind != PathKind::kSavedIntGroupwise) return;
  c.be.quantize_int_groupwise(x, s.packed, s.scales, s.saved_spec(path), key);
}
void saved_int_weight_grad(const ProjectionCall& c, const PathSpec& path, const Tensor& dy,
                           Tensor& dw) {
  const CpuProjectionState& s = c.state;
  const ProjectionShape& shape = s.shape;
  Tensor restored;
  restored.shape = {shape.tokens, shape.in};
  Tensor xd = x_scratch(c, restored);
  const int copy = s.shared_copy(path);
  if (copy >= 0) {
    GNMR_CHECK(s.shared->book.written(copy),
               "projection_backward: the shared saved copy was not written by this x's forward");
    const size_t i = static_cast<size_t>(copy);
    c.be.dequantize_int_groupwise(s.shared->packed[i], s.shared->scales[i], s.saved_spec(path), xd);
  } else {
    c.be.dequantize_int_groupwise(s.packed, s.scales, s.saved_spec(path), xd);
  }
  c.be.matmul_backward_weight(xd, dy, dw, c.be.gemm_precision());
}

// ---- kFineGrainedFp: every GEMM input fake-quantized (DeepSeek-V3 §3.3.2) ----------------
// Activations and output gradients in 1 x tile tiles along the reduction dim of the forward
// and input-gradient GEMMs, tile x 1 along N for the weight gradient; weights tile x tile.

void fine_grained_forward(const ProjectionCall& c, const PathSpec& path, const Tensor& x,
                          Tensor& y) {
  const Tensor& wq =
      required(prepared_weight(c, WeightTreatment::kFineGrainedFp, path.format, path.tile), path);
  Tensor xq = x_scratch(c, x);
  c.be.fake_quantize_fp_blockwise(x, xq, path.format, 1, path.tile);
  c.be.matmul_forward(xq, wq, y, GemmPrecision::FP32);
}
void fine_grained_input_grad(const ProjectionCall& c, const PathSpec& path, Tensor& dy, Tensor& dx,
                             bool accumulate) {
  const Tensor& wq =
      required(prepared_weight(c, WeightTreatment::kFineGrainedFp, path.format, path.tile), path);
  Tensor dyq = input_grad_dy(c, dy);
  c.be.fake_quantize_fp_blockwise(dy, dyq, path.format, 1, path.tile);
  c.be.matmul_backward_input(dyq, wq, dx, accumulate, GemmPrecision::FP32);
}
void fine_grained_weight_grad(const ProjectionCall& c, const PathSpec& path, const Tensor& x,
                              const Tensor& dy, Tensor& dw) {
  Tensor xq = x_scratch(c, x), dyq = dy_scratch(c, dy);
  c.be.fake_quantize_fp_blockwise(x, xq, path.format, path.tile, 1);
  c.be.fake_quantize_fp_blockwise(dy, dyq, path.format, path.tile, 1);
  c.be.matmul_backward_weight(xq, dyq, dw, GemmPrecision::FP32);
}

// ---- kInt8Gemm: int8 per-token activations / output gradients and per-output-channel
// weights; the weight gradient has its per-token scales along its reduction (N), so it runs
// in bf16 (SwitchBack, arXiv:2304.13013) ----------------------------------------------------

void int8_forward(const ProjectionCall& c, const PathSpec& path, const Tensor& x, Tensor& y) {
  const Tensor& wq =
      required(prepared_weight(c, WeightTreatment::kInt8PerRow, FpFormat::kE4M3, 0), path);
  Tensor xq = x_scratch(c, x);
  c.be.fake_quantize_int8_per_row(x, xq);
  c.be.matmul_forward(xq, wq, y, GemmPrecision::FP32);
}
void int8_input_grad(const ProjectionCall& c, const PathSpec& path, Tensor& dy, Tensor& dx,
                     bool accumulate) {
  const Tensor& wq =
      required(prepared_weight(c, WeightTreatment::kInt8PerRow, FpFormat::kE4M3, 0), path);
  Tensor dyq = input_grad_dy(c, dy);
  c.be.fake_quantize_int8_per_row(dy, dyq);
  c.be.matmul_backward_input(dyq, wq, dx, accumulate, GemmPrecision::FP32);
}

}  // namespace

bool CpuProjectionState::reads_forward_input(const PathSpec& path) const {
  return path.kind != PathKind::kSavedIntGroupwise;
}

size_t CpuProjectionState::saved_bytes(const PathSpec& path) const {
  if (path.kind != PathKind::kSavedIntGroupwise) return 0;
  const GroupwiseSpec spec = saved_spec(path);
  return packed_bytes(shape.tokens, shape.in, spec) +
         scale_count(shape.tokens, shape.in, spec) * sizeof(float);
}

GroupwiseSpec CpuProjectionState::saved_spec(const PathSpec& path) const {
  return groupwise_spec_for_width(path.saved, shape.in);
}

int CpuProjectionState::shared_copy(const PathSpec& path) const {
  if (shared == nullptr || path.kind != PathKind::kSavedIntGroupwise) return -1;
  return shared->book.copy_of(saved_spec(path));
}

size_t CpuProjectionState::planned_saved_bytes() const {
  size_t bytes = packed.data == nullptr ? 0 : packed.bytes() + scales.bytes();
  if (shared != nullptr && shared_member == 0) {
    for (size_t i = 0; i < shared->packed.size(); ++i) {
      bytes += shared->packed[i].bytes() + shared->scales[i].bytes();
    }
  }
  return bytes;
}

std::unique_ptr<CpuProjectionState> plan_projection(Backend& be, const std::string& name,
                                                    const ProjectionShape& shape,
                                                    const PathSpec& low, const PathSpec& recovery) {
  auto state = std::make_unique<CpuProjectionState>();
  state->shape = shape;
  const PathSpec* paths[2] = {&low, &recovery};
  // A whole number of 64-byte lines per buffer.
  auto packed_size_of = [&](const GroupwiseSpec& spec) {
    return round_up(static_cast<int64_t>(packed_bytes(shape.tokens, shape.in, spec)), 64);
  };
  auto scale_size_of = [&](const GroupwiseSpec& spec) {
    return round_up(static_cast<int64_t>(scale_count(shape.tokens, shape.in, spec)), 16);
  };

  // The shared copies: the leader allocates one per spec, the others join its book.
  if (!shape.shared_saved_specs.empty()) {
    if (shape.saved_input_leader == nullptr) {
      state->shared = std::make_shared<CpuSharedCodes>(shape.shared_saved_specs);
      for (size_t i = 0; i < shape.shared_saved_specs.size(); ++i) {
        const GroupwiseSpec& spec = shape.shared_saved_specs[i];
        validate_groupwise_spec(shape.in, spec);
        const std::string copy = name + ".shared_saved_" + std::to_string(i);
        state->shared->packed.push_back(be.allocate(copy + "_codes", {packed_size_of(spec)},
                                                    DType::U8, MemoryRole::SavedActivations));
        state->shared->scales.push_back(be.allocate(copy + "_scales", {scale_size_of(spec)},
                                                    DType::F32, MemoryRole::SavedActivations));
      }
    } else {
      const auto* leader = dynamic_cast<const CpuProjectionState*>(shape.saved_input_leader);
      GNMR_CHECK(leader != nullptr && leader->shared != nullptr &&
                     leader->shape.tokens == shape.tokens && leader->shape.in == shape.in,
                 "plan_projection " + name +
                     ": saved_input_leader is not a cpu projection planned as the leader of an "
                     "input of this shape");
      state->shared = leader->shared;
    }
    state->shared_member = state->shared->book.join();
  }

  // Own saved codes: room for the larger of the two paths not kept in a shared copy.
  int64_t packed_size = 0, scale_size = 0;
  bool saves_codes = false, own_codes = false, fine_grained = false, prepared = false;
  for (const PathSpec* path : paths) {
    fine_grained |= path->kind == PathKind::kFineGrainedFp;
    prepared |= needs_prepared_weight(path->kind);
    if (path->kind != PathKind::kSavedIntGroupwise) continue;
    saves_codes = true;
    if (state->shared_copy(*path) >= 0) continue;
    own_codes = true;
    const GroupwiseSpec spec = state->saved_spec(*path);
    validate_groupwise_spec(shape.in, spec);
    packed_size = std::max<int64_t>(packed_size, packed_size_of(spec));
    scale_size = std::max<int64_t>(scale_size, scale_size_of(spec));
  }
  if (own_codes) {
    state->packed =
        be.allocate(name + ".saved_codes", {packed_size}, DType::U8, MemoryRole::SavedActivations);
    state->scales =
        be.allocate(name + ".saved_scales", {scale_size}, DType::F32, MemoryRole::SavedActivations);
  }

  // The prepared weight: a second copy of the weight, only when a path (or bf16 GEMMs, set
  // before planning) reads the weight changed.
  prepared |= be.gemm_precision() == GemmPrecision::BF16;
  if (prepared) {
    state->prepared = be.allocate(name + ".prepared_weight", {shape.out, shape.in}, DType::F32,
                                  MemoryRole::Scratch);
  }
  // Scratch: x for the rounded / quantized forward input and the dequantized codes; dy for
  // the quantized output gradient (the weight gradient's fine-grained copy always, the input
  // gradient's when dy may not be overwritten).
  if (prepared || saves_codes) state->x_scratch = shape.tokens * shape.in;
  if (prepared && (fine_grained || !shape.backward_may_overwrite_dy)) {
    state->dy_scratch = shape.tokens * shape.out;
  }
  return state;
}

void projection_forward(const ProjectionCall& c, const PathSpec& path, const Tensor& x, Tensor& y,
                        bool save, const RngKey& key) {
  switch (path.kind) {
    case PathKind::kBackendGemm:
    case PathKind::kSavedIntGroupwise:
      backend_gemm_forward(c, x, y);
      break;
    case PathKind::kBf16Gemm:
      bf16_forward(c, x, y);
      break;
    case PathKind::kFineGrainedFp:
      fine_grained_forward(c, path, x, y);
      break;
    case PathKind::kInt8Gemm:
      int8_forward(c, path, x, y);
      break;
  }
  if (!save) return;
  c.state.saved_input = x;
  // Every saving forward of a sharer goes through the book, whatever its path.
  if (path.kind == PathKind::kSavedIntGroupwise || c.state.shared != nullptr) {
    saved_int_save(c, path, x, key);
  }
}

void projection_backward(const ProjectionCall& c, const PathSpec& path, Tensor& dy, Tensor& dx,
                         bool accumulate_dx, Tensor& dw) {
  const Tensor& x = c.state.saved_input;
  GNMR_CHECK(!c.state.reads_forward_input(path) || x.data != nullptr,
             "projection_backward before a saving projection_forward");
  switch (path.kind) {
    case PathKind::kBackendGemm:
      backend_gemm_weight_grad(c, x, dy, dw);
      backend_gemm_input_grad(c, dy, dx, accumulate_dx);
      break;
    case PathKind::kSavedIntGroupwise:
      saved_int_weight_grad(c, path, dy, dw);
      backend_gemm_input_grad(c, dy, dx, accumulate_dx);
      break;
    case PathKind::kBf16Gemm:
      bf16_weight_grad(c, x, dy, dw);
      bf16_input_grad(c, dy, dx, accumulate_dx);
      break;
    case PathKind::kFineGrainedFp:
      fine_grained_weight_grad(c, path, x, dy, dw);
      fine_grained_input_grad(c, path, dy, dx, accumulate_dx);
      break;
    case PathKind::kInt8Gemm:
      bf16_weight_grad(c, x, dy, dw);  // SwitchBack: see int8_forward
      int8_input_grad(c, path, dy, dx, accumulate_dx);
      break;
  }
}

}  // namespace cpu
}  // namespace gnmr
