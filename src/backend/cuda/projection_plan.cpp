// The CUDA projection executor's operand preparation and buffers (projection_plan.h).
#include "backend/cuda/projection_plan.h"

#include <algorithm>

#include "backend/shared_saved_input.h"
#include "precision/scale_layout.h"

namespace gnmr {

namespace {

size_t u(int64_t v) {
  return static_cast<size_t>(v);
}

// How a GEMM implementation prepares an operand that is not a saved-int restore.
OperandPrep prep_for(GemmImpl impl, const PathSpec& path) {
  switch (impl) {
    case GemmImpl::kFp32:
      return OperandPrep::kAsIs;
    case GemmImpl::kBf16:
      return OperandPrep::kBf16;
    case GemmImpl::kFp8Block:
      return OperandPrep::kFp8Codes;
    case GemmImpl::kInt8:
      return OperandPrep::kInt8Codes;
    case GemmImpl::kEmulated:
      return path.kind == PathKind::kInt8Gemm ? OperandPrep::kFakeQuantInt8
                                              : OperandPrep::kFakeQuantFp;
  }
  return OperandPrep::kAsIs;
}

}  // namespace

const char* operand_prep_name(OperandPrep prep) {
  switch (prep) {
    case OperandPrep::kAsIs:
      return "as_is";
    case OperandPrep::kBf16:
      return "bf16";
    case OperandPrep::kFp8Codes:
      return "fp8_codes";
    case OperandPrep::kInt8Codes:
      return "int8_codes";
    case OperandPrep::kFakeQuantFp:
      return "fake_quant_fp";
    case OperandPrep::kFakeQuantInt8:
      return "fake_quant_int8";
    case OperandPrep::kDequantized:
      return "dequantized";
    case OperandPrep::kDequantizedBf16:
      return "dequantized_bf16";
  }
  return "?";
}

ProjectionGemm plan_projection_gemm(GemmRole role, const ProjectionShape& shape,
                                    const PathSpec& path, GemmPrecision backend_precision,
                                    const GpuTarget& target, bool accumulate) {
  ProjectionGemm g;
  g.plan = plan_gemm(role, shape.tokens, shape.in, shape.out, path, backend_precision, target,
                     accumulate);
  g.a = g.b = prep_for(g.plan.impl, path);
  // The saved-int path's weight gradient reads the unit's restored codes, not x.
  if (role == GemmRole::kWeightGradient && path.kind == PathKind::kSavedIntGroupwise) {
    g.a =
        g.plan.impl == GemmImpl::kBf16 ? OperandPrep::kDequantizedBf16 : OperandPrep::kDequantized;
  }
  return g;
}

std::string describe_projection_gemms(const ProjectionShape& shape, const PathSpec& path,
                                      GemmPrecision backend_precision, const GpuTarget& target) {
  std::string each[3];
  int i = 0;
  for (GemmRole role : {GemmRole::kForward, GemmRole::kInputGradient, GemmRole::kWeightGradient}) {
    const GemmPlan p =
        plan_gemm(role, shape.tokens, shape.in, shape.out, path, backend_precision, target, false);
    each[i++] = std::string(gemm_impl_name(p.impl)) +
                (p.emulated_because.empty() ? "" : " (" + p.emulated_because + ")");
  }
  if (each[0] == each[1] && each[1] == each[2]) return each[0];
  return "forward " + each[0] + ", input_gradient " + each[1] + ", weight_gradient " + each[2];
}

PreparedInputKey prepared_input_key(const void* group, uint64_t generation, const void* x,
                                    OperandPrep prep, GemmRole role, const PathSpec& path) {
  PreparedInputKey key;
  key.prep = prep;
  switch (prep) {
    case OperandPrep::kBf16:
      break;
    case OperandPrep::kFp8Codes:
      key.format = path.format;
      key.transposed = role == GemmRole::kWeightGradient;
      break;
    case OperandPrep::kInt8Codes:
      if (role != GemmRole::kForward) return key;
      break;
    default:
      return key;
  }
  key.group = group;
  key.generation = generation;
  key.x = x;
  return key;
}

bool same_prepared_input(const PreparedInputKey& held, const PreparedInputKey& wanted) {
  return held.group != nullptr && held.group == wanted.group &&
         held.generation == wanted.generation && held.x == wanted.x && held.prep == wanted.prep &&
         held.format == wanted.format && held.transposed == wanted.transposed;
}

DyPreparation backward_dy_preparation(const ProjectionGemm& weight_gradient,
                                      const ProjectionGemm& input_gradient) {
  if (weight_gradient.b != input_gradient.b) return DyPreparation::kPerGemm;
  switch (weight_gradient.b) {
    case OperandPrep::kBf16:
      return DyPreparation::kBf16Once;
    case OperandPrep::kFp8Codes:
      return DyPreparation::kFp8BothOnce;
    default:
      return DyPreparation::kPerGemm;
  }
}

bool forward_keeps_x_t(const ProjectionGemm& forward, const ProjectionGemm& weight_gradient) {
  return forward.b == OperandPrep::kFp8Codes && weight_gradient.a == OperandPrep::kFp8Codes;
}

bool forward_keeps_x_bf16(const ProjectionGemm& forward, const ProjectionGemm& weight_gradient) {
  return forward.b == OperandPrep::kBf16 && weight_gradient.a == OperandPrep::kBf16;
}

KeptX kept_x_of(const ProjectionShape& shape, const PathSpec& path, GemmPrecision backend_precision,
                const GpuTarget& target) {
  const ProjectionGemm forward =
      plan_projection_gemm(GemmRole::kForward, shape, path, backend_precision, target, false);
  const ProjectionGemm weight_gradient = plan_projection_gemm(
      GemmRole::kWeightGradient, shape, path, backend_precision, target, false);
  if (forward_keeps_x_t(forward, weight_gradient)) return KeptX::kTransposedCodes;
  if (forward_keeps_x_bf16(forward, weight_gradient)) return KeptX::kBf16;
  return KeptX::kNone;
}

bool kept_copies_replace_x(const ProjectionShape& shape, const PathSpec& low,
                           const PathSpec& recovery, GemmPrecision backend_precision,
                           const GpuTarget& target) {
  if (shape.input_read_elsewhere) return false;
  bool any = false;
  for (const PathSpec* path : {&low, &recovery}) {
    const bool keeps = kept_x_of(shape, *path, backend_precision, target) != KeptX::kNone;
    if (!keeps && path->kind != PathKind::kSavedIntGroupwise) return false;
    any = any || keeps;
  }
  return any;
}

Fp8DyPairLayout fp8_dy_pair_layout(int64_t tokens, int64_t out) {
  auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  Fp8DyPairLayout l;
  l.codes = aligned(u(tokens) * u(out));
  l.codes_bytes = l.codes + u(tokens) * u(out);
  l.scales = aligned(sizeof(float) * u(vec128_scale_count(out, tokens)));
  l.scales_bytes = l.scales + sizeof(float) * u(vec128_scale_count(tokens, out));
  return l;
}

ProjectionBuffers projection_buffers(const ProjectionShape& shape, const PathSpec& low,
                                     const PathSpec& recovery, GemmPrecision backend_precision,
                                     const GpuTarget& target) {
  ProjectionBuffers b;
  const size_t n = u(shape.tokens), in = u(shape.in), out = u(shape.out);
  for (const PathSpec* path : {&low, &recovery}) {
    for (GemmRole role :
         {GemmRole::kForward, GemmRole::kInputGradient, GemmRole::kWeightGradient}) {
      const ProjectionGemm g =
          plan_projection_gemm(role, shape, *path, backend_precision, target, false);
      // The weight side (A of the forward and the input gradient).
      if (role != GemmRole::kWeightGradient) {
        switch (g.a) {
          case OperandPrep::kBf16:
            b.weight_bf16 = out * in * 2;
            break;
          case OperandPrep::kFp8Codes:
            b.weight_fp8_codes = 2 * out * in;
            b.weight_fp8_scales = sizeof(float) * u(blk128_scale_count(shape.out, shape.in) +
                                                    blk128_scale_count(shape.in, shape.out));
            break;
          case OperandPrep::kInt8Codes:
            b.weight_int8_codes = out * in;
            b.weight_int8_scales = out * sizeof(float);
            break;
          case OperandPrep::kFakeQuantFp:
          case OperandPrep::kFakeQuantInt8:
            b.weight_fake_quant = out * in * sizeof(float);
            break;
          default:
            break;
        }
      }
      // The x side (B of the forward, A of the weight gradient).
      const OperandPrep x = role == GemmRole::kForward          ? g.b
                            : role == GemmRole::kWeightGradient ? g.a
                                                                : OperandPrep::kAsIs;
      switch (x) {
        case OperandPrep::kBf16:
          b.x_low = std::max(b.x_low, n * in * 2);
          break;
        case OperandPrep::kFp8Codes:
          b.x_low = std::max(b.x_low, n * in);
          b.x_scales = std::max(
              b.x_scales, sizeof(float) * u(std::max(vec128_scale_count(shape.tokens, shape.in),
                                                     vec128_scale_count(shape.in, shape.tokens))));
          break;
        case OperandPrep::kInt8Codes:
          b.x_low = std::max(b.x_low, n * in);
          b.x_scales = std::max(b.x_scales, n * sizeof(float));
          break;
        case OperandPrep::kFakeQuantFp:
        case OperandPrep::kFakeQuantInt8:
        case OperandPrep::kDequantized:
          b.x_f32 = std::max(b.x_f32, n * in * sizeof(float));
          break;
        case OperandPrep::kDequantizedBf16:  // dequantized straight to bf16: no fp32 copy
          b.x_low = std::max(b.x_low, n * in * 2);
          break;
        case OperandPrep::kAsIs:
          break;
      }
      // The dy side (B of the input and weight gradients).
      if (role != GemmRole::kForward) {
        switch (g.b) {
          case OperandPrep::kBf16:
            b.dy_low = std::max(b.dy_low, n * out * 2);
            break;
          case OperandPrep::kFp8Codes:
            b.dy_low = std::max(b.dy_low, n * out);
            b.dy_scales =
                std::max(b.dy_scales,
                         sizeof(float) * u(std::max(vec128_scale_count(shape.tokens, shape.out),
                                                    vec128_scale_count(shape.out, shape.tokens))));
            break;
          case OperandPrep::kFakeQuantFp:
          case OperandPrep::kFakeQuantInt8:
            // The weight gradient's copy always (dy is read again by the input gradient);
            // the input gradient's only when dy may not be overwritten.
            if (role == GemmRole::kWeightGradient || !shape.backward_may_overwrite_dy) {
              b.dy_f32 = std::max(b.dy_f32, n * out * sizeof(float));
            }
            break;
          default:
            break;
        }
      }
    }
    const DyPreparation dy =
        backward_dy_preparation(plan_projection_gemm(GemmRole::kWeightGradient, shape, *path,
                                                     backend_precision, target, false),
                                plan_projection_gemm(GemmRole::kInputGradient, shape, *path,
                                                     backend_precision, target, false));
    const bool keeps_x_t =
        kept_x_of(shape, *path, backend_precision, target) == KeptX::kTransposedCodes;
    if (keeps_x_t && shape.input_leader == nullptr) {
      b.saved_x_t_codes = in * n;
      b.saved_x_t_scales = sizeof(float) * u(vec128_scale_count(shape.in, shape.tokens));
      b.saved_x_t_copies = std::max(b.saved_x_t_copies, 1);
    }
    if (dy == DyPreparation::kFp8BothOnce) {
      const Fp8DyPairLayout pair = fp8_dy_pair_layout(shape.tokens, shape.out);
      b.dy_low = std::max(b.dy_low, pair.codes_bytes);
      b.dy_scales = std::max(b.dy_scales, pair.scales_bytes);
    }
    if (path->kind == PathKind::kSavedIntGroupwise) {
      const GroupwiseSpec spec = groupwise_spec_for_width(path->saved, shape.in);
      validate_groupwise_spec(shape.in, spec);
      const bool shared =
          std::any_of(shape.shared_saved_specs.begin(), shape.shared_saved_specs.end(),
                      [&](const GroupwiseSpec& s) { return same_groupwise_spec(s, spec); });
      if (shared) continue;
      b.saved_codes = std::max(b.saved_codes, packed_bytes(shape.tokens, shape.in, spec));
      b.saved_scales =
          std::max(b.saved_scales, sizeof(float) * scale_count(shape.tokens, shape.in, spec));
    }
  }
  if (shape.input_leader == nullptr &&
      kept_copies_replace_x(shape, low, recovery, backend_precision, target)) {
    const KeptX kept_low = kept_x_of(shape, low, backend_precision, target);
    const KeptX kept_recovery = kept_x_of(shape, recovery, backend_precision, target);
    if (kept_low == KeptX::kBf16 || kept_recovery == KeptX::kBf16) b.saved_x_bf16 = n * in * 2;
    if (kept_low == KeptX::kTransposedCodes && kept_recovery == KeptX::kTransposedCodes &&
        low.format != recovery.format) {
      b.saved_x_t_copies = 2;
      b.saved_x_t_formats[0] = low.format;
      b.saved_x_t_formats[1] = recovery.format;
    }
  }
  if (shape.saved_input_leader == nullptr) {
    for (const GroupwiseSpec& spec : shape.shared_saved_specs) {
      validate_groupwise_spec(shape.in, spec);
      b.shared_codes.push_back(packed_bytes(shape.tokens, shape.in, spec));
      b.shared_scales.push_back(sizeof(float) * scale_count(shape.tokens, shape.in, spec));
    }
  }
  return b;
}

}  // namespace gnmr
