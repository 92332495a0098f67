// CudaAttentionOps and the choice of kernels (cuda_attention.h).
#include "backend/cuda/cuda_attention.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "backend/tensor_checks.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {

namespace {

// The emulated build (tests only): FlashTiles::Auto keeps the default tiles there.
#ifdef GNMR_CUDA_EMULATED
constexpr bool kEmulatedCuda = true;
#else
constexpr bool kEmulatedCuda = false;
#endif

const char* attention_choice_name(CudaAttention choice) {
  switch (choice) {
    case CudaAttention::Auto:
      return "auto";
    case CudaAttention::Flash:
      return "flash";
    case CudaAttention::FlashBf16:
      return "flash_bf16";
    case CudaAttention::FlashWgmma:
      return "flash_wgmma";
    case CudaAttention::Materialized:
      return "materialized";
  }
  return "?";
}

}  // namespace

AttentionKernel attention_kernel_for(CudaAttention choice, bool bf16_gemms,
                                     const AttentionShape& shape, int64_t shared_limit,
                                     bool& warned) {
  if (choice == CudaAttention::Materialized) return AttentionKernel::Materialized;
  const bool tensor_cores = choice == CudaAttention::FlashBf16 ||
                            choice == CudaAttention::FlashWgmma ||
                            (choice == CudaAttention::Auto && bf16_gemms);
  const AttentionKernel flash =
      tensor_cores ? AttentionKernel::FlashTensorCores : AttentionKernel::FlashSimt;
  const bool supported = flash_attention_supports_head_dim(shape.head_dim);
  if (choice != CudaAttention::Auto && !supported) {
    throw Error(ErrorKind::Config, std::string("model.attention \"") +
                                       attention_choice_name(choice) + "\": head dim " +
                                       std::to_string(shape.head_dim) + " (" +
                                       attention_shape_text(shape) +
                                       ") is not supported by the flash kernels (64, 128); use "
                                       "model.attention=materialized or auto");
  }
  if (!supported) return AttentionKernel::Materialized;
  const int64_t needed = flash_attention_shared_bytes(shape.head_dim, shape.seq, tensor_cores);
  if (needed <= shared_limit) return flash;
  if (choice != CudaAttention::Auto) {
    throw Error(ErrorKind::Runtime,
                std::string("model.attention \"") + attention_choice_name(choice) + "\": the " +
                    "kernels need " + std::to_string(needed) +
                    " bytes of shared memory per block for " + attention_shape_text(shape) +
                    ", this GPU allows " + std::to_string(shared_limit) +
                    "; use model.attention=materialized or auto");
  }
  if (!warned) {
    spdlog::warn(
        "model.attention auto: the flash kernels need {} bytes of shared memory per "
        "block for {}, this GPU allows {}; running the materialized kernels",
        needed, attention_shape_text(shape), shared_limit);
  }
  warned = true;
  return AttentionKernel::Materialized;
}

bool asks_wgmma_trial(CudaAttention choice, bool has_trial, bool tiles_timed,
                      AttentionKernel kernel, bool device_runs_wgmma) {
  return choice == CudaAttention::Auto && has_trial && tiles_timed &&
         kernel == AttentionKernel::FlashTensorCores && device_runs_wgmma;
}

bool flash_tiles_timed(FlashTiles tiles) {
  return tiles == FlashTiles::Timed || (tiles == FlashTiles::Auto && !kEmulatedCuda);
}

CudaAttentionOps::CudaAttentionOps(const CudaBackendOptions& options, int device,
                                   int64_t shared_optin_bytes, LtGemmRunner& gemm)
    : choice_(options.attention),
      time_flash_tiles_(flash_tiles_timed(options.flash_tiles)),
      wgmma_trial_(options.wgmma_trial),
      device_(device),
      shared_optin_bytes_(shared_optin_bytes),
      v1_(gemm.handle(), gemm.workspace(), LtGemmRunner::kWorkspaceBytes) {}

std::unique_ptr<AttentionState> CudaAttentionOps::plan(const AttentionContext& ctx,
                                                       const std::string& name,
                                                       const AttentionShape& shape, bool out_kept) {
  auto state = std::make_unique<CudaAttentionState>();
  state->shape = shape;
  state->kernel_kind = attention_kernel_for(choice_, ctx.gemm_precision == GemmPrecision::BF16,
                                            shape, shared_optin_bytes_, warned_flash_fallback_);
  state->tiles_timed = time_flash_tiles_;
  if (state->kernel_kind == AttentionKernel::FlashTensorCores) {  // made at the shape's first plan
    std::shared_ptr<FlashShapeChoice>& choice = flash_choices_[FlashChoiceKey{
        shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim}];
    if (!choice) choice = std::make_shared<FlashShapeChoice>();
    state->choice = choice;
  }
  if (choice_ == CudaAttention::FlashWgmma &&
      state->kernel_kind == AttentionKernel::FlashTensorCores) {
    const std::string unavailable = flash_wgmma_unavailable(device_);
    if (!unavailable.empty()) {
      throw Error(ErrorKind::Config,
                  "model.attention \"flash_wgmma\" needs sm_90a's wgmma (an H100 or H200, and "
                  "a build with sm_90a code); here: " +
                      unavailable + "; use model.attention=flash_bf16 or auto");
    }
    state->instruction = FlashMmaInstruction::Wgmma;
  }
  state->wgmma_offered =
      asks_wgmma_trial(choice_, bool(wgmma_trial_), time_flash_tiles_, state->kernel_kind,
                       flash_wgmma_unavailable(device_).empty());
  if (state->wgmma_offered) {
    std::optional<std::string>& problem = state->choice->wgmma_trial_problem;
    if (!problem) {
      problem = wgmma_trial_(shape);
      if (!problem->empty()) {
        spdlog::warn(
            "tensor-core flash at {}: the wgmma kernels are left out ({}); running "
            "mma.sync",
            attention_shape_text(shape), *problem);
      }
    }
    state->wgmma_offered = problem->empty();
  }
  if (state->wgmma_offered && !digest_partials_.data) {
    digest_partials_ = allocate_tensor(ctx.memory, "flash.digest_partials",
                                       {2 * kBitsDigestPartials}, DType::F32, MemoryRole::Scratch);
  }
  state->v1_precision = ctx.gemm_precision;
  state->out_kept = state->flash() && out_kept;
  if (state->flash() && !out_kept) {
    state->out = allocate_tensor(ctx.memory, name + ".out",
                                 {shape.batch, shape.seq, shape.heads, shape.head_dim}, DType::F32,
                                 MemoryRole::SavedActivations);
  }
  if (state->flash()) {
    state->lse = allocate_tensor(ctx.memory, name + ".lse", {shape.batch, shape.heads, shape.seq},
                                 DType::F32, MemoryRole::SavedActivations);
  }
  if (state->keeps_inputs()) {  // whole floats: 256-byte regions (flash_mma_buffers)
    const int64_t bytes = flash_attention_mma_inputs_bytes(shape.batch, shape.seq, shape.heads,
                                                           shape.kv_heads, shape.head_dim);
    state->inputs_bf16 = allocate_tensor(ctx.memory, name + ".inputs_bf16", {bytes / 4}, DType::F32,
                                         MemoryRole::SavedActivations);
  }
  if (!state->flash()) {
    state->probs = allocate_tensor(ctx.memory, name + ".probs",
                                   {shape.batch, shape.heads, shape.seq, shape.seq}, DType::F32,
                                   MemoryRole::SavedActivations);
  }
  scratch_.reserve(ctx.memory, scratch_bytes(*state));
  return state;
}

void CudaAttentionOps::forward(const AttentionContext& ctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, const RopeTables* rope, Tensor& out,
                               AttentionState& saved) {
  const auto timing = OpTimer::Scope(ctx.timer, "attention");
  const AttentionShape s = attention_shape_of(q, k);
  check_same_numel(k, v, "attention_forward");
  check_same_numel(q, out, "attention_forward");
  CudaAttentionState& state = state_of(saved, s);
  GNMR_CHECK(rope == nullptr || state.kernel_kind == AttentionKernel::FlashTensorCores,
             "attention_forward: only the tensor-core kernels rotate q and k");
  if (state.flash()) {
    if (state.kernel_kind == AttentionKernel::FlashTensorCores) {
      // Its bf16 copies of q, k, v go to the state, for the backward.
      FlashPassChoice& choice = state.choice->forward;
      const bool choose = !choice.chosen;
      const FlashVariant variant =
          choose ? FlashVariant{state.instruction, kFlashMmaForwardQueryTile} : choice.variant;
      flash_attention_forward_mma(f32_data(q), f32_data(k), f32_data(v), rope ? rope->cos : nullptr,
                                  rope ? rope->sin : nullptr, f32_data(out), f32_data(state.lse),
                                  state.inputs_bf16.data, s.batch, s.seq, s.heads, s.kv_heads,
                                  s.head_dim, ctx.stream, variant.tile, variant.instruction);
      if (choose) {  // the kernel again on the bf16 copies the call made
        choose_flash_variant(ctx, choice, state, "the forward", variant,
                             flash_query_tiles(kFlashMmaForwardQueryTile),
                             [&](const FlashVariant& v) {
                               flash_forward_mma_kernel_only(state.inputs_bf16.data, f32_data(out),
                                                             f32_data(state.lse), s.batch, s.seq,
                                                             s.heads, s.kv_heads, s.head_dim,
                                                             ctx.stream, v.tile, v.instruction);
                             },
                             {&out, &state.lse});
      }
    } else {
      flash_attention_forward(f32_data(q), f32_data(k), f32_data(v), f32_data(out),
                              f32_data(state.lse), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                              ctx.stream);
    }
    if (state.out_kept) {
      state.caller_out = f32_data(out);  // the caller leaves it unchanged until the backward
    } else {
      // The backward reads the state's out: the caller may overwrite its own.
      GNMR_CUDA_CHECK(cudaMemcpyAsync(state.out.data, out.data, out.bytes(),
                                      cudaMemcpyDeviceToDevice, ctx.stream));
    }
    return;
  }
  v1_.forward(f32_data(q), f32_data(k), f32_data(v), f32_data(out), f32_data(state.probs), s,
              state.v1_precision, ctx.stream);
}

void CudaAttentionOps::backward(const AttentionContext& ctx, const Tensor& q, const Tensor& k,
                                const Tensor& v, const AttentionState& saved, const Tensor& dout,
                                Tensor& dq, Tensor& dk, Tensor& dv) {
  const auto timing = OpTimer::Scope(ctx.timer, "attention");
  const AttentionShape s = attention_shape_of(q, k);
  check_same_numel(q, dq, "attention_backward");
  check_same_numel(q, dout, "attention_backward");
  check_same_numel(k, dk, "attention_backward");
  check_same_numel(v, dv, "attention_backward");
  const CudaAttentionState& state = state_of(saved, s);
  void* scratch = scratch_.reserve(ctx.memory, scratch_bytes(state));
  if (state.kernel_kind == AttentionKernel::FlashTensorCores) {
    // q, k, v as the forward's bf16 copies in the state (keeps_inputs): those passed are
    // not read.
    FlashPassChoice& choice = state.choice->backward;
    const bool choose = !choice.chosen;
    const int64_t default_tile = flash_mma_query_pass_tile(s.head_dim);
    const FlashVariant variant =
        choose ? FlashVariant{state.instruction, default_tile} : choice.variant;
    flash_attention_backward_mma(state.inputs_bf16.data, state.flash_out(), f32_data(state.lse),
                                 f32_data(dout), f32_data(dq), f32_data(dk), f32_data(dv), scratch,
                                 s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, ctx.stream,
                                 variant.tile, variant.instruction);
    if (choose) {
      // The two passes again on the dout copy and delta the call left in scratch; the dq
      // pass has 128-row tiles at head dim 64 only.
      const std::vector<int64_t> tiles =
          s.head_dim == 64 ? flash_query_tiles(default_tile) : std::vector<int64_t>{default_tile};
      choose_flash_variant(
          ctx, choice, state, "the backward", variant, tiles,
          [&](const FlashVariant& v) {
            flash_dq_pass_mma_only(state.inputs_bf16.data, f32_data(state.lse), scratch,
                                   f32_data(dq), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                                   ctx.stream, v.tile, v.instruction);
            flash_key_value_pass_mma_only(state.inputs_bf16.data, f32_data(state.lse), scratch,
                                          f32_data(dk), f32_data(dv), s.batch, s.seq, s.heads,
                                          s.kv_heads, s.head_dim, ctx.stream, v.instruction);
          },
          {&dq, &dk, &dv});
    }
    return;
  }
  if (state.flash()) {  // each backward takes its own forward's out and lse
    flash_attention_backward(f32_data(q), f32_data(k), f32_data(v), state.flash_out(),
                             f32_data(state.lse), f32_data(dout), f32_data(dq), f32_data(dk),
                             f32_data(dv), static_cast<float*>(scratch), s.batch, s.seq, s.heads,
                             s.kv_heads, s.head_dim, ctx.stream);
    return;
  }
  v1_.backward(f32_data(q), f32_data(k), f32_data(v), f32_data(state.probs), f32_data(dout),
               f32_data(dq), f32_data(dk), f32_data(dv), static_cast<float*>(scratch), s,
               state.v1_precision, ctx.stream);
}

const CudaAttentionState& CudaAttentionOps::state_of(const AttentionState& saved,
                                                     const AttentionShape& s) {
  const auto* state = dynamic_cast<const CudaAttentionState*>(&saved);
  GNMR_CHECK(state != nullptr, "attention state was not planned by the cuda backend");
  const AttentionShape& p = state->shape;
  GNMR_CHECK(p.batch == s.batch && p.seq == s.seq && p.heads == s.heads &&
                 p.kv_heads == s.kv_heads && p.head_dim == s.head_dim,
             "attention: state planned for " + attention_shape_text(p) + ", called with " +
                 attention_shape_text(s));
  return *state;
}

CudaAttentionState& CudaAttentionOps::state_of(AttentionState& saved, const AttentionShape& s) {
  return const_cast<CudaAttentionState&>(state_of(static_cast<const AttentionState&>(saved), s));
}

size_t CudaAttentionOps::scratch_bytes(const CudaAttentionState& state) {
  const AttentionShape& s = state.shape;
  if (state.kernel_kind == AttentionKernel::FlashTensorCores) {
    return size_t(
        flash_attention_mma_scratch_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim));
  }
  const int64_t floats = state.flash()
                             ? flash_attention_backward_scratch_floats(s.batch, s.seq, s.heads)
                             : MaterializedAttention::backward_scratch_floats(s);
  return sizeof(float) * size_t(floats);
}

// Makes `choice`: the variant `pass` runs from now on, after a first call that ran `ran` (the
// state's instruction at the default tile, `tiles[0]`) and left `outputs`. With the tiles not
// timed, `ran`. Otherwise: where the state offers wgmma, `run` runs it at that tile and the
// bits digest of `outputs` decides whether it joins (the same bits as mma.sync's) or is left
// out (logged as a warning, and choice.wgmma_other_bits); then the offered variants are timed
// (a single one is run once, to leave its bits), the choice is logged, and `outputs` hold the
// chosen variant's bits. Each digest and the timing wait for the stream: a shape's first step
// waits a few times more.
void CudaAttentionOps::choose_flash_variant(const AttentionContext& ctx, FlashPassChoice& choice,
                                            const CudaAttentionState& state, const char* pass,
                                            const FlashVariant& ran,
                                            const std::vector<int64_t>& tiles,
                                            const std::function<void(const FlashVariant&)>& run,
                                            const std::vector<const Tensor*>& outputs) {
  choice.chosen = true;
  choice.variant = ran;
  if (!time_flash_tiles_) return;
  const std::string shape = attention_shape_text(state.shape);
  std::vector<FlashMmaInstruction> instructions = {ran.instruction};
  if (state.wgmma_offered) {
    const std::vector<uint64_t> reference = output_digests(ctx, outputs);
    run(FlashVariant{FlashMmaInstruction::Wgmma, ran.tile});
    if (output_digests(ctx, outputs) == reference) {
      instructions.push_back(FlashMmaInstruction::Wgmma);
    } else {
      choice.wgmma_other_bits = true;
      spdlog::warn(
          "tensor-core flash at {}: {}'s wgmma kernels wrote other bits than its mma.sync "
          "kernels; running mma.sync (model.attention=flash_wgmma runs wgmma)",
          shape, pass);
    }
  }
  const std::vector<FlashVariant> variants = flash_variants(instructions, tiles);
  if (variants.size() == 1 && !state.wgmma_offered) return;  // nothing ran since the call
  ++ctx.sync_count;
  const FlashVariantTiming timing =
      time_flash_variants(ctx.stream, variants.size(), [&](size_t i) { run(variants[i]); });
  spdlog::info("tensor-core flash at {}: {} runs {}", shape, pass,
               flash_variant_timing_text(variants, timing));
  choice.variant = variants[timing.chosen];
}

// The bits digest of each tensor (bits_digest.h); each waits for the stream.
std::vector<uint64_t> CudaAttentionOps::output_digests(const AttentionContext& ctx,
                                                       const std::vector<const Tensor*>& outputs) {
  std::vector<uint64_t> digests;
  for (const Tensor* t : outputs) {
    ++ctx.sync_count;
    digests.push_back(bits_digest(t->data, int64_t(t->bytes() / 4),
                                  static_cast<uint64_t*>(digest_partials_.data), ctx.stream));
  }
  return digests;
}

}  // namespace gnmr::cuda
