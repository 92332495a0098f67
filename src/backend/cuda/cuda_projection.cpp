// The CUDA projection executor (cuda_projection.h). Shapes: x: [N, in]; W: [out, in];
// y, dy: [N, out]; dx: [N, in]; N = tokens. As on the CPU, the backward runs the weight
// gradient first, then the input gradient (the last reader of dy, which it may overwrite when
// the shape allows it).
#include "backend/cuda/cuda_projection.h"

#include <cstdint>
#include <string>
#include <vector>

#include "backend/tensor_checks.h"
#include "kernels/quantize.cuh"
#include "kernels/train_ops.cuh"
#include "precision/scale_layout.h"
#include "util/error.h"

namespace gnmr {
namespace cuda {

namespace {

// One GEMM operand as cuBLASLt reads it.
struct Operand {
  const void* data = nullptr;
  const float* scales = nullptr;  // fp8 codes (cuBLASLt reads them); int8 codes (our epilogue)
};

// The int8 GEMM's operands: 8-bit codes with one scale per row, exactly the codes and scales
// whose product fake_quantize_int8_per_row writes (precision/fake_quantize_int.h).
constexpr GroupwiseSpec kInt8PerRow{8, kGroupRow, false};

void* need(const DeviceScratch& s, size_t bytes, const char* what) {
  GNMR_CHECK(s.data != nullptr && s.bytes >= bytes,
             std::string("cuda projection: ") + what + " scratch of " + std::to_string(s.bytes) +
                 " bytes was planned, " + std::to_string(bytes) + " needed");
  return s.data;
}

// Whether p holds W prepared as `prep` for `path` in this weights epoch; stamp: it now does.
bool fresh(const PreparedWeight& p, const ProjectionContext& c, const PathSpec& path,
           OperandPrep prep) {
  return p.epoch == c.weights_epoch && p.prep == prep && p.format == path.format &&
         p.tile == path.tile;
}
void stamp(PreparedWeight& p, const ProjectionContext& c, const PathSpec& path, OperandPrep prep) {
  p.epoch = c.weights_epoch;
  p.prep = prep;
  p.format = path.format;
  p.tile = path.tile;
}

// W's FP8 operands in s.weight_fp8: W's 128x128 codes, then W^T's; W's scales, then W^T's.
FpBlock128x128Weight fp8_weight_operands(const CudaProjectionState& s, const PathSpec& path,
                                         const Tensor& w) {
  const PreparedWeight& p = s.weight_fp8;
  GNMR_CHECK(p.data != nullptr, "cuda projection: no fp8 weight was planned");
  const int64_t out = s.shape.out, in = s.shape.in;
  uint8_t* codes = static_cast<uint8_t*>(p.data);
  return {f32_data(w),
          out,
          in,
          path.format,
          codes,
          p.scales,
          codes + out * in,
          p.scales + blk128_scale_count(out, in)};
}

// The weight side: W as the forward (transposed = false) or the input gradient (true) reads it.
Operand weight_operand(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                       OperandPrep prep, const Tensor& w, bool transposed) {
  const int64_t out = s.shape.out, in = s.shape.in;
  const float* wf = f32_data(w);
  switch (prep) {
    case OperandPrep::kAsIs:
      return {wf, nullptr};
    case OperandPrep::kBf16: {
      PreparedWeight& p = s.weight_bf16;
      GNMR_CHECK(p.data != nullptr, "cuda projection: no bf16 weight was planned");
      if (!fresh(p, c, path, prep)) {
        convert_to_bf16(wf, out * in, static_cast<uint16_t*>(p.data), c.stream);
        stamp(p, c, path, prep);
      }
      return {p.data, nullptr};  // the descriptor transposes for the input gradient
    }
    case OperandPrep::kFp8Codes: {
      const FpBlock128x128Weight m = fp8_weight_operands(s, path, w);
      if (!fresh(s.weight_fp8, c, path, prep)) {  // not made by prepare_weights
        quantize_fp_block_128x128_batch({m}, c.stream);
        stamp(s.weight_fp8, c, path, prep);
      }
      return transposed ? Operand{m.codes_t, m.scales_t} : Operand{m.codes, m.scales};
    }
    case OperandPrep::kInt8Codes: {  // the forward's A only (gemm_plan.h)
      PreparedWeight& p = s.weight_int8;
      GNMR_CHECK(p.data != nullptr && !transposed, "cuda projection: no int8 weight was planned");
      if (!fresh(p, c, path, prep)) {
        quantize_int_groupwise(wf, out, in, kInt8PerRow, static_cast<uint8_t*>(p.data), p.scales,
                               RngKey{}, c.stream);
        stamp(p, c, path, prep);
      }
      return {p.data, p.scales};
    }
    case OperandPrep::kFakeQuantFp:
    case OperandPrep::kFakeQuantInt8: {
      PreparedWeight& p = s.weight_fake_quant;
      GNMR_CHECK(p.data != nullptr, "cuda projection: no fake-quantized weight was planned");
      float* wq = static_cast<float*>(p.data);
      if (!fresh(p, c, path, prep)) {
        if (prep == OperandPrep::kFakeQuantFp) {  // DeepSeek-V3: tile x tile weight blocks
          fake_quantize_fp_blockwise(wf, wq, out, in, path.format, path.tile, path.tile, c.stream);
        } else {  // one scale per output channel
          fake_quantize_int8_per_row(wf, out, in, wq, c.stream);
        }
        stamp(p, c, path, prep);
      }
      return {wq, nullptr};
    }
    case OperandPrep::kDequantized:
    case OperandPrep::kDequantizedBf16:
      break;
  }
  throw Error(ErrorKind::Runtime, std::string("cuda projection: a weight cannot be prepared as ") +
                                      operand_prep_name(prep));
}

// The x side: B of the forward (1 x tile tiles along in) or A of the weight gradient (tile x 1
// along N, transposed for FP8). keep_x (a saving forward that forward_keeps_x_t or
// forward_keeps_x_bf16): x^T's 128x1 codes go to the group's kept copy too, or x's bf16 rounding
// goes to the group's kept bf16 copy (where it keeps one), for its weight gradients.
// computed_x (forward_takes_computed_x): x is written by the kernel that makes its form.
Operand x_operand(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                  OperandPrep prep, GemmRole role, const Tensor& x, bool keep_x = false,
                  const ComputedX* computed_x = nullptr) {
  const int64_t n = s.shape.tokens, in = s.shape.in;
  const bool wgrad = role == GemmRole::kWeightGradient;
  ProjectionScratch& sc = c.scratch;
  // The bf16, fp8 and int8 forms are made once per input group and generation: a projection
  // finding its key in the scratch reads what the group's earlier call left there.
  const CudaProjectionState& leader = s.input_leader != nullptr ? *s.input_leader : s;
  const PreparedInputKey key =
      prepared_input_key(&leader, leader.input_generation, x.data, prep, role, path);
  // x^T's codes as the group's forward kept them (the copy for the path's format): the weight
  // gradient reads them there.
  CudaSavedTransposedX::Copy* kept = s.saved_x_t != nullptr && prep == OperandPrep::kFp8Codes
                                         ? &s.saved_x_t->of(path.format)
                                         : nullptr;
  if (wgrad && kept != nullptr && same_prepared_input(kept->holds, key)) {
    ++s.x_t_kept_reads;
    return {kept->codes, kept->scales};
  }
  // x's bf16 copy as the group's saving forward kept it: the weight gradient reads it there,
  // and so does a later forward of the group.
  CudaSavedBf16X* kept_bf16 = s.saved_x_bf16.get();
  if (kept_bf16 != nullptr && same_prepared_input(kept_bf16->holds, key)) {
    GNMR_CHECK(computed_x == nullptr,
               "cuda projection: a computed x needs a forward that prepares x");
    ++(wgrad ? s.x_bf16_kept_reads : s.x_reused);
    return {kept_bf16->data, nullptr};
  }
  // Where the backward does not read x (kept_copies_replace_x), x may have been overwritten
  // since the forward: the weight gradient must find the copy the forward kept.
  GNMR_CHECK(!wgrad || (prep != OperandPrep::kBf16 && prep != OperandPrep::kFp8Codes) ||
                 s.reads_forward_input(path),
             "cuda projection: the weight gradient on " + path.describe() +
                 " reads the copy of x its saving forward keeps, and none holds this x (a "
                 "backward without its saving forward, or after another forward of the group)");
  const bool held = same_prepared_input(sc.x_low_holds, key);
  if (key.group != nullptr) ++(held ? s.x_reused : s.x_prepared);
  switch (prep) {
    case OperandPrep::kAsIs:
      return {f32_data(x), nullptr};
    case OperandPrep::kBf16: {
      // keep_x (a saving forward whose group keeps the copy): rounded into the kept copy, which
      // the group's weight gradients read in place of x; otherwise into the scratch.
      const bool into_kept = keep_x && kept_bf16 != nullptr;
      auto* out = into_kept ? kept_bf16->data
                            : static_cast<uint16_t*>(need(sc.x_low, size_t(n * in) * 2, "x bf16"));
      GNMR_CHECK(computed_x == nullptr || (!held && computed_x->bf16),
                 "cuda projection: a computed x needs a forward that prepares x, in a form its "
                 "producer offers");
      if (computed_x != nullptr) {  // x itself written here too
        computed_x->bf16(out);
      } else if (into_kept || !held) {
        convert_to_bf16(f32_data(x), n * in, out, c.stream);
      }
      (into_kept ? kept_bf16->holds : sc.x_low_holds) = key;
      return {out, nullptr};
    }
    case OperandPrep::kFp8Codes: {
      auto* codes = static_cast<uint8_t*>(need(sc.x_low, size_t(n * in), "x codes"));
      auto* scales = static_cast<float*>(need(
          sc.x_scales, sizeof(float) * size_t(vec128_scale_count(wgrad ? in : n, wgrad ? n : in)),
          "x scales"));
      // keep_x (the forward only): x^T's codes too, unless the kept copy holds them.
      PreparedInputKey t_key;
      bool keep = false;
      if (keep_x && kept != nullptr) {
        t_key = prepared_input_key(&leader, leader.input_generation, x.data, prep,
                                   GemmRole::kWeightGradient, path);
        keep = !same_prepared_input(kept->holds, t_key);
      }
      GNMR_CHECK(computed_x == nullptr || (!held && keep && computed_x->fp8_pair),
                 "cuda projection: a computed x needs a forward that makes both of its FP8 "
                 "operands, from a producer that offers them");
      if (computed_x != nullptr) {  // x itself written here too
        computed_x->fp8_pair(path.format, codes, scales, kept->codes, kept->scales);
      } else if (!held && wgrad) {
        quantize_fp_tile_128x1_transposed(f32_data(x), n, in, path.format, codes, scales, c.stream);
      } else if (!held && keep) {  // both from one read of x
        quantize_fp_tile_1x128_and_transposed(f32_data(x), n, in, path.format, codes, scales,
                                              kept->codes, kept->scales, c.stream);
      } else if (!held) {
        quantize_fp_tile_1x128(f32_data(x), n, in, path.format, ScaleOrder::kVec128, codes, scales,
                               c.stream);
      } else if (keep) {  // the forward's codes were made by a call that kept none
        quantize_fp_tile_128x1_transposed(f32_data(x), n, in, path.format, kept->codes,
                                          kept->scales, c.stream);
      }
      if (keep) kept->holds = t_key;
      sc.x_low_holds = key;
      return {codes, scales};
    }
    case OperandPrep::kInt8Codes: {  // the forward's B only (gemm_plan.h)
      GNMR_CHECK(!wgrad, "cuda projection: int8 codes of x are planned for the forward only");
      auto* codes = static_cast<uint8_t*>(need(sc.x_low, size_t(n * in), "x codes"));
      auto* scales = static_cast<float*>(need(sc.x_scales, sizeof(float) * size_t(n), "x scales"));
      if (!held) {
        quantize_int_groupwise(f32_data(x), n, in, kInt8PerRow, codes, scales, RngKey{}, c.stream);
      }
      sc.x_low_holds = key;
      return {codes, scales};
    }
    case OperandPrep::kFakeQuantFp: {
      auto* out = static_cast<float*>(need(sc.x_f32, sizeof(float) * size_t(n * in), "x fp32"));
      fake_quantize_fp_blockwise(f32_data(x), out, n, in, path.format, wgrad ? path.tile : 1,
                                 wgrad ? 1 : path.tile, c.stream);
      return {out, nullptr};
    }
    case OperandPrep::kFakeQuantInt8: {
      auto* out = static_cast<float*>(need(sc.x_f32, sizeof(float) * size_t(n * in), "x fp32"));
      fake_quantize_int8_per_row(f32_data(x), n, in, out, c.stream);
      return {out, nullptr};
    }
    case OperandPrep::kDequantized:
    case OperandPrep::kDequantizedBf16: {
      const void* codes = s.saved_codes;
      const float* scales = s.saved_scales;
      const int copy = s.shared_copy(path);
      if (copy >= 0) {
        GNMR_CHECK(s.shared->book.written(copy),
                   "cuda projection: the shared saved copy was not written by this x's forward");
        codes = s.shared->codes[static_cast<size_t>(copy)];
        scales = s.shared->scales[static_cast<size_t>(copy)];
      }
      if (prep == OperandPrep::kDequantized) {
        auto* restored =
            static_cast<float*>(need(sc.x_f32, sizeof(float) * size_t(n * in), "x fp32"));
        dequantize_int_groupwise(static_cast<const uint8_t*>(codes), scales, n, in,
                                 s.saved_spec(path), restored, c.stream);
        return {restored, nullptr};
      }
      // Rounded to bf16 as it is dequantized: no fp32 x written and read back.
      auto* out = static_cast<uint16_t*>(need(sc.x_low, size_t(n * in) * 2, "x bf16"));
      dequantize_int_groupwise_to_bf16(static_cast<const uint8_t*>(codes), scales, n, in,
                                       s.saved_spec(path), out, c.stream);
      sc.x_low_holds = key;  // shared with no call
      return {out, nullptr};
    }
  }
  return {};
}

// The dy side: B of the input gradient (1 x tile along out) and of the weight gradient
// (tile x 1 along N, transposed for FP8).
Operand dy_operand(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                   OperandPrep prep, GemmRole role, Tensor& dy) {
  const int64_t n = s.shape.tokens, out = s.shape.out;
  const bool wgrad = role == GemmRole::kWeightGradient;
  ProjectionScratch& sc = c.scratch;
  // Where a fake-quantized dy goes: dy itself for the input gradient when allowed.
  auto f32_target = [&]() {
    if (!wgrad && s.shape.backward_may_overwrite_dy) return f32_data(dy);
    return static_cast<float*>(need(sc.dy_f32, sizeof(float) * size_t(n * out), "dy fp32"));
  };
  switch (prep) {
    case OperandPrep::kAsIs:
      return {f32_data(dy), nullptr};
    case OperandPrep::kBf16: {
      auto* low = static_cast<uint16_t*>(need(sc.dy_low, size_t(n * out) * 2, "dy bf16"));
      convert_to_bf16(f32_data(dy), n * out, low, c.stream);
      return {low, nullptr};
    }
    case OperandPrep::kFp8Codes: {
      auto* codes = static_cast<uint8_t*>(need(sc.dy_low, size_t(n * out), "dy codes"));
      auto* scales = static_cast<float*>(
          need(sc.dy_scales,
               sizeof(float) * size_t(vec128_scale_count(wgrad ? out : n, wgrad ? n : out)),
               "dy scales"));
      if (wgrad) {
        quantize_fp_tile_128x1_transposed(f32_data(dy), n, out, path.format, codes, scales,
                                          c.stream);
      } else {
        quantize_fp_tile_1x128(f32_data(dy), n, out, path.format, ScaleOrder::kVec128, codes,
                               scales, c.stream);
      }
      return {codes, scales};
    }
    case OperandPrep::kFakeQuantFp: {
      float* target = f32_target();
      fake_quantize_fp_blockwise(f32_data(dy), target, n, out, path.format, wgrad ? path.tile : 1,
                                 wgrad ? 1 : path.tile, c.stream);
      return {target, nullptr};
    }
    case OperandPrep::kFakeQuantInt8: {
      float* target = f32_target();
      fake_quantize_int8_per_row(f32_data(dy), n, out, target, c.stream);
      return {target, nullptr};
    }
    case OperandPrep::kInt8Codes:
    case OperandPrep::kDequantized:
    case OperandPrep::kDequantizedBf16:
      break;
  }
  throw Error(ErrorKind::Runtime,
              std::string("cuda projection: dy cannot be prepared as ") + operand_prep_name(prep));
}

// DyPreparation::kFp8BothOnce: dy^T's 128x1 codes (the weight gradient's B) and dy's 1x128
// codes (the input gradient's B) from one read of dy, side by side in the dy-side scratch.
struct DyOperands {
  Operand weight_gradient, input_gradient;
};
DyOperands fp8_dy_operands(const ProjectionContext& c, const CudaProjectionState& s,
                           const PathSpec& path, const Tensor& dy, const ComputedDy* computed) {
  const int64_t n = s.shape.tokens, out = s.shape.out;
  const Fp8DyPairLayout l = fp8_dy_pair_layout(n, out);
  auto* codes = static_cast<uint8_t*>(need(c.scratch.dy_low, l.codes_bytes, "dy codes (both)"));
  auto* scales =
      static_cast<unsigned char*>(need(c.scratch.dy_scales, l.scales_bytes, "dy scales (both)"));
  uint8_t *codes_t = codes + l.codes_t, *codes_n = codes + l.codes;
  auto* scales_t = reinterpret_cast<float*>(scales + l.scales_t);
  auto* scales_n = reinterpret_cast<float*>(scales + l.scales);
  if (computed != nullptr) {
    computed->fp8_pair(path.format, codes_n, scales_n, codes_t, scales_t);
  } else {
    quantize_fp_tile_1x128_and_transposed(f32_data(dy), n, out, path.format, codes_n, scales_n,
                                          codes_t, scales_t, c.stream);
  }
  return {{codes_t, scales_t}, {codes_n, scales_n}};
}

void run(const ProjectionContext& c, const ProjectionGemm& g, const Operand& a, const Operand& b,
         Tensor& d) {
  const OpTimer::Scope timing(c.timer, "gemm");
  if (g.plan.impl != GemmImpl::kInt8) {
    c.gemm.run(g.plan, a.data, a.scales, b.data, b.scales, f32_data(d), c.stream);
    return;
  }
  // The int32 sums land in d's own memory, then become fp32 in place.
  c.gemm.run(g.plan, a.data, nullptr, b.data, nullptr, f32_data(d), c.stream);
  dequantize_int8_gemm_output(f32_data(d), a.scales, b.scales, g.plan.m, g.plan.n, c.stream);
}

void check_shapes(const CudaProjectionState& s, const Tensor& w, const char* what) {
  GNMR_CHECK(w.numel() == s.shape.out * s.shape.in,
             std::string(what) + ": W " + w.shape_string() + " is not the planned [" +
                 std::to_string(s.shape.out) + ", " + std::to_string(s.shape.in) + "]");
}

}  // namespace

int CudaSavedTransposedX::index_of(FpFormat format) const {
  if (count < 2) return 0;
  GNMR_CHECK(
      format == formats[0] || format == formats[1],
      std::string("cuda projection: no kept x^T copy holds ") + fp_format_name(format) + " codes");
  return format == formats[0] ? 0 : 1;
}

size_t CudaProjectionState::saved_bytes(const PathSpec& path) const {
  if (path.kind != PathKind::kSavedIntGroupwise) {
    if (!copies_replace_x) return 0;  // the backward reads x
    if (kept_x_of(shape, path, precision, target) == KeptX::kBf16) return saved_x_bf16->bytes;
    return saved_x_t->bytes_each;
  }
  const GroupwiseSpec spec = saved_spec(path);
  return packed_bytes(shape.tokens, shape.in, spec) +
         scale_count(shape.tokens, shape.in, spec) * sizeof(float);
}

int CudaProjectionState::group_copy(const PathSpec& path) const {
  if (path.kind == PathKind::kSavedIntGroupwise || !copies_replace_x) return -1;
  if (kept_x_of(shape, path, precision, target) == KeptX::kBf16) return 2;
  return saved_x_t->index_of(path.format);  // 0 or 1
}

std::unique_ptr<CudaProjectionState> plan_projection(const ProjectionContext& c,
                                                     const std::string& name,
                                                     const ProjectionShape& shape,
                                                     const PathSpec& low,
                                                     const PathSpec& recovery) {
  auto s = std::make_unique<CudaProjectionState>();
  s->shape = shape;
  s->precision = c.precision;
  s->target = c.target;
  s->buffers = projection_buffers(shape, low, recovery, c.precision, c.target);
  s->copies_replace_x = kept_copies_replace_x(shape, low, recovery, c.precision, c.target);
  const ProjectionBuffers& b = s->buffers;
  DeviceMemory& m = c.memory;
  if (b.saved_codes > 0) {
    s->saved_codes = m.allocate(name + ".saved_codes", b.saved_codes, MemoryRole::SavedActivations);
    s->saved_scales = static_cast<float*>(
        m.allocate(name + ".saved_scales", b.saved_scales, MemoryRole::SavedActivations));
  }
  // The shared copies: the leader allocates one per spec, the others join its book.
  if (!shape.shared_saved_specs.empty()) {
    if (shape.saved_input_leader == nullptr) {
      s->shared = std::make_shared<CudaSharedCodes>(shape.shared_saved_specs);
      for (size_t i = 0; i < b.shared_codes.size(); ++i) {
        const std::string copy = name + ".shared_saved_" + std::to_string(i);
        s->shared->codes.push_back(
            m.allocate(copy + "_codes", b.shared_codes[i], MemoryRole::SavedActivations));
        s->shared->scales.push_back(static_cast<float*>(
            m.allocate(copy + "_scales", b.shared_scales[i], MemoryRole::SavedActivations)));
        s->shared->planned_bytes += b.shared_codes[i] + b.shared_scales[i];
      }
    } else {
      const auto* leader = dynamic_cast<const CudaProjectionState*>(shape.saved_input_leader);
      GNMR_CHECK(leader != nullptr && leader->shared != nullptr &&
                     leader->shape.tokens == shape.tokens && leader->shape.in == shape.in,
                 "cuda plan_projection " + name +
                     ": saved_input_leader is not a cuda projection planned as the leader of an "
                     "input of this shape");
      s->shared = leader->shared;
    }
    s->shared_member = s->shared->book.join();
  }
  if (b.saved_x_t_copies > 0) {
    s->saved_x_t = std::make_shared<CudaSavedTransposedX>();
    CudaSavedTransposedX& kept = *s->saved_x_t;
    kept.count = b.saved_x_t_copies;
    kept.bytes_each = b.saved_x_t_codes + b.saved_x_t_scales;
    for (int i = 0; i < kept.count; ++i) {
      const std::string copy = name + ".saved_x_t" + (kept.count > 1 ? std::to_string(i) : "");
      kept.copies[i].codes = static_cast<uint8_t*>(
          m.allocate(copy + "_codes", b.saved_x_t_codes, MemoryRole::SavedActivations));
      kept.copies[i].scales = static_cast<float*>(
          m.allocate(copy + "_scales", b.saved_x_t_scales, MemoryRole::SavedActivations));
      kept.formats[i] = b.saved_x_t_formats[i];
    }
  }
  if (b.saved_x_bf16 > 0) {
    s->saved_x_bf16 = std::make_shared<CudaSavedBf16X>();
    s->saved_x_bf16->bytes = b.saved_x_bf16;
    s->saved_x_bf16->data = static_cast<uint16_t*>(
        m.allocate(name + ".saved_x_bf16", b.saved_x_bf16, MemoryRole::SavedActivations));
  }
  if (b.weight_bf16 > 0) {
    s->weight_bf16.data = m.allocate(name + ".weight_bf16", b.weight_bf16, MemoryRole::Scratch);
  }
  if (b.weight_fp8_codes > 0) {
    s->weight_fp8.data =
        m.allocate(name + ".weight_fp8_codes", b.weight_fp8_codes, MemoryRole::Scratch);
    s->weight_fp8.scales = static_cast<float*>(
        m.allocate(name + ".weight_fp8_scales", b.weight_fp8_scales, MemoryRole::Scratch));
  }
  if (b.weight_int8_codes > 0) {
    s->weight_int8.data =
        m.allocate(name + ".weight_int8_codes", b.weight_int8_codes, MemoryRole::Scratch);
    s->weight_int8.scales = static_cast<float*>(
        m.allocate(name + ".weight_int8_scales", b.weight_int8_scales, MemoryRole::Scratch));
  }
  if (b.weight_fake_quant > 0) {
    s->weight_fake_quant.data =
        m.allocate(name + ".weight_fake_quant", b.weight_fake_quant, MemoryRole::Scratch);
  }
  ProjectionScratch& sc = c.scratch;
  if (b.x_f32 > 0) sc.x_f32.reserve(m, b.x_f32);
  if (b.x_low > 0) sc.x_low.reserve(m, b.x_low);
  if (b.x_scales > 0) sc.x_scales.reserve(m, b.x_scales);
  if (b.dy_f32 > 0) sc.dy_f32.reserve(m, b.dy_f32);
  if (b.dy_low > 0) sc.dy_low.reserve(m, b.dy_low);
  if (b.dy_scales > 0) sc.dy_scales.reserve(m, b.dy_scales);
  sc.x_low_holds = PreparedInputKey{};  // a reservation may have moved x_low
  if (shape.input_leader != nullptr) {
    s->input_leader = dynamic_cast<const CudaProjectionState*>(shape.input_leader);
    GNMR_CHECK(s->input_leader != nullptr && s->input_leader->input_leader == nullptr &&
                   s->input_leader->shape.tokens == shape.tokens &&
                   s->input_leader->shape.in == shape.in,
               "cuda plan_projection " + name +
                   ": input_leader is not a cuda projection leading an input of this shape");
    s->saved_x_t = s->input_leader->saved_x_t;  // null when the leader's paths keep none
    s->saved_x_bf16 = s->input_leader->saved_x_bf16;
    // A projection whose weight gradients read the group's copies in place of x needs them:
    // the group's leader planned with the same copies.
    const ProjectionBuffers& held = s->input_leader->buffers;
    ProjectionShape as_leader = shape;
    as_leader.input_leader = nullptr;
    const ProjectionBuffers wanted =
        projection_buffers(as_leader, low, recovery, c.precision, c.target);
    GNMR_CHECK(s->input_leader->copies_replace_x == s->copies_replace_x &&
                   held.saved_x_bf16 == wanted.saved_x_bf16 &&
                   held.saved_x_t_copies == wanted.saved_x_t_copies &&
                   (wanted.saved_x_t_copies < 2 ||
                    (held.saved_x_t_formats[0] == wanted.saved_x_t_formats[0] &&
                     held.saved_x_t_formats[1] == wanted.saved_x_t_formats[1])),
               "cuda plan_projection " + name +
                   ": its input group's leader was planned with other paths, so the group does "
                   "not agree on the copies of x it keeps");
  }
  return s;
}

void prepare_weights(const ProjectionContext& c, const std::vector<WeightToPrepare>& weights) {
  std::vector<FpBlock128x128Weight> batch;
  std::vector<const WeightToPrepare*> made;
  for (const WeightToPrepare& u : weights) {
    check_shapes(u.state, u.w, "prepare_projection_weights");
    const OperandPrep prep = OperandPrep::kFp8Codes;
    // Nothing to plan where no path of the unit has FP8 weights, or this epoch made them (every
    // forward of a step after its first): this runs before each forward's first launch.
    const PreparedWeight& p = u.state.weight_fp8;
    if (p.data == nullptr || fresh(p, c, u.path, prep)) continue;
    // The forward's A and the input gradient's A are W's operands (projection_plan.h).
    const OperandPrep forward = plan_projection_gemm(GemmRole::kForward, u.state.shape, u.path,
                                                     c.precision, c.target, false)
                                    .a;
    const OperandPrep input_gradient = plan_projection_gemm(GemmRole::kInputGradient, u.state.shape,
                                                            u.path, c.precision, c.target, false)
                                           .a;
    if (forward != prep && input_gradient != prep) continue;
    batch.push_back(fp8_weight_operands(u.state, u.path, u.w));
    made.push_back(&u);
  }
  if (batch.empty()) return;
  const OpTimer::Scope timing(c.timer, "prep W");
  quantize_fp_block_128x128_batch(batch, c.stream);
  for (const WeightToPrepare* u : made) {
    stamp(u->state.weight_fp8, c, u->path, OperandPrep::kFp8Codes);
    ++u->state.weights_prepared_in_batch;
  }
}

bool forward_takes_computed_x(const ProjectionContext& c, const CudaProjectionState& s,
                              const PathSpec& path, bool save, const ComputedX& from) {
  if (s.input_leader != nullptr) return false;
  const ProjectionGemm g =
      plan_projection_gemm(GemmRole::kForward, s.shape, path, c.precision, c.target, false);
  if (g.b == OperandPrep::kBf16) return bool(from.bf16);
  return from.fp8_pair && save && s.saved_x_t != nullptr &&
         forward_keeps_x_t(g, plan_projection_gemm(GemmRole::kWeightGradient, s.shape, path,
                                                   c.precision, c.target, true));
}

void projection_forward(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                        const Tensor& w, const Tensor& x, Tensor& y, bool save, const RngKey& key,
                        const ComputedX* computed_x) {
  check_shapes(s, w, "projection_forward");
  GNMR_CHECK(x.numel() == s.shape.tokens * s.shape.in && y.numel() == s.shape.tokens * s.shape.out,
             "projection_forward: x " + x.shape_string() + ", y " + y.shape_string() +
                 " do not match the plan");
  GNMR_CHECK(computed_x == nullptr || forward_takes_computed_x(c, s, path, save, *computed_x),
             "projection_forward: a computed x needs a forward that leads its input and rounds x "
             "to bf16, or a saving one that quantizes x to FP8 codes with x^T's, in a form its "
             "producer offers, not " +
                 path.describe());
  // A leader's forward starts a new x for its group: a generation no call has seen.
  if (s.input_leader == nullptr) s.input_generation = ++c.scratch.group_forwards;
  const ProjectionGemm g =
      plan_projection_gemm(GemmRole::kForward, s.shape, path, c.precision, c.target, false);
  // Each operand's preparation is its own op family in bench's breakdown ("prep W", "prep x",
  // ...): which kernel a family runs follows from the recipe's paths (gemm_impl).
  Operand a, b;
  {
    const OpTimer::Scope timing(c.timer, "prep W");
    a = weight_operand(c, s, path, g.a, w, false);
  }
  {
    const OpTimer::Scope timing(c.timer, "prep x");
    const ProjectionGemm wg =
        plan_projection_gemm(GemmRole::kWeightGradient, s.shape, path, c.precision, c.target, true);
    const bool keep_x = save && (forward_keeps_x_t(g, wg) || forward_keeps_x_bf16(g, wg));
    b = x_operand(c, s, path, g.b, GemmRole::kForward, x, keep_x, computed_x);
    if (computed_x != nullptr) ++s.computed_x_forwards;
  }
  run(c, g, a, b, y);
  if (!save) return;
  const OpTimer::Scope timing(c.timer, "prep saved x");  // the saved copy's quantization
  s.saved_input = x;
  // Every saving forward of a sharer goes through the book, whatever its path; a shared copy
  // is quantized by the first saving forward on its spec since the leader's.
  const int copy = s.shared_copy(path);
  if (s.shared != nullptr && s.shared->book.save(s.shared_member, copy, x.data)) {
    const size_t i = static_cast<size_t>(copy);
    quantize_int_groupwise(f32_data(x), s.shape.tokens, s.shape.in, s.saved_spec(path),
                           static_cast<uint8_t*>(s.shared->codes[i]), s.shared->scales[i], key,
                           c.stream);
  }
  if (copy < 0 && path.kind == PathKind::kSavedIntGroupwise) {
    GNMR_CHECK(s.saved_codes != nullptr, "projection_forward: no saved codes were planned");
    quantize_int_groupwise(f32_data(x), s.shape.tokens, s.shape.in, s.saved_spec(path),
                           static_cast<uint8_t*>(s.saved_codes), s.saved_scales, key, c.stream);
  }
}

DyPreparation backward_dy_preparation_of(const ProjectionContext& c, const CudaProjectionState& s,
                                         const PathSpec& path, bool accumulate_dx) {
  return backward_dy_preparation(
      plan_projection_gemm(GemmRole::kWeightGradient, s.shape, path, c.precision, c.target, true),
      plan_projection_gemm(GemmRole::kInputGradient, s.shape, path, c.precision, c.target,
                           accumulate_dx));
}

void projection_backward(const ProjectionContext& c, CudaProjectionState& s, const PathSpec& path,
                         const Tensor& w, Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dw,
                         const ComputedDy* computed_dy) {
  check_shapes(s, w, "projection_backward");
  GNMR_CHECK(!s.reads_forward_input(path) || s.saved_input.data != nullptr,
             "projection_backward before a saving projection_forward");
  GNMR_CHECK(dw.numel() == w.numel() && dy.numel() == s.shape.tokens * s.shape.out &&
                 dx.numel() == s.shape.tokens * s.shape.in,
             "projection_backward: dy " + dy.shape_string() + ", dx " + dx.shape_string() +
                 ", dW " + dw.shape_string() + " do not match the plan");
  const ProjectionGemm wg =
      plan_projection_gemm(GemmRole::kWeightGradient, s.shape, path, c.precision, c.target, true);
  const ProjectionGemm ig = plan_projection_gemm(GemmRole::kInputGradient, s.shape, path,
                                                 c.precision, c.target, accumulate_dx);
  const DyPreparation dy_prep = backward_dy_preparation(wg, ig);
  GNMR_CHECK(computed_dy == nullptr ||
                 (dy_prep == DyPreparation::kFp8BothOnce && computed_dy->fp8_pair) ||
                 (dy_prep == DyPreparation::kBf16Once && computed_dy->bf16),
             "projection_backward: a dy computed by the kernel that prepares it needs a path "
             "whose GEMMs both read one form of dy, not " +
                 path.describe());
  Operand xa, wa;
  DyOperands dyo;
  {
    const OpTimer::Scope timing(c.timer, "prep x (dW)");
    xa = x_operand(c, s, path, wg.a, GemmRole::kWeightGradient, s.saved_input);
  }
  if (dy_prep == DyPreparation::kFp8BothOnce) {
    const OpTimer::Scope timing(c.timer, "prep dy (dW+dx)");
    dyo = fp8_dy_operands(c, s, path, dy, computed_dy);
    if (computed_dy != nullptr) ++s.computed_dy_backwards;
  } else if (computed_dy != nullptr) {  // kBf16Once
    const OpTimer::Scope timing(c.timer, "prep dy (dW)");
    auto* low = static_cast<uint16_t*>(
        need(c.scratch.dy_low, size_t(s.shape.tokens * s.shape.out) * 2, "dy bf16"));
    computed_dy->bf16(low);
    dyo.weight_gradient = {low, nullptr};
    ++s.computed_dy_backwards;
  } else {
    const OpTimer::Scope timing(c.timer, "prep dy (dW)");
    dyo.weight_gradient = dy_operand(c, s, path, wg.b, GemmRole::kWeightGradient, dy);
  }
  run(c, wg, xa, dyo.weight_gradient, dw);
  {
    const OpTimer::Scope timing(c.timer, "prep W");
    wa = weight_operand(c, s, path, ig.a, w, true);
  }
  if (dy_prep == DyPreparation::kBf16Once) dyo.input_gradient = dyo.weight_gradient;
  if (dy_prep == DyPreparation::kPerGemm) {
    const OpTimer::Scope timing(c.timer, "prep dy (dx)");
    dyo.input_gradient = dy_operand(c, s, path, ig.b, GemmRole::kInputGradient, dy);
  }
  run(c, ig, wa, dyo.input_gradient, dx);
}

}  // namespace cuda
}  // namespace gnmr
