// The CUDA backend's attention (Backend::plan_attention, attention_forward,
// rope_attention_forward, attention_backward; docs/DESIGN.md §6): per layer, v1's materialized
// kernels (attention_v1.h), the fp32 SIMT flash kernels (kernels/flash_attention.cu) or the bf16
// tensor-core ones (kernels/flash_attention_mma.cu), as model.attention chooses
// (cuda_backend.h's CudaAttention), and the state each layer keeps from its forward to its
// backward. Compared with the CPU backend's attention in tests/gpu.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/flash_kernel_choice.h"
#include "backend/cuda/op_timer.h"
#include "backend/flash_layout.h"

namespace gnmr::cuda {

// The attention kernels a layer runs: v1 (attention_v1.h), the SIMT flash kernels
// (kernels/flash_attention.cu, fp32 throughout) or the bf16 tensor-core ones
// (kernels/flash_attention_mma.cu).
enum class AttentionKernel { Materialized, FlashSimt, FlashTensorCores };

// The variant each tensor-core flash pass runs at an attention shape, chosen at its first
// forward and first backward (flash_kernel_choice.h); shared by the CudaAttentionOps that made
// it and the shape's attention states, whose kernel() names it.
struct FlashPassChoice {
  bool chosen = false;
  cuda::FlashVariant variant;
  bool wgmma_other_bits = false;  // wgmma was offered and its outputs' digest differed
};
struct FlashShapeChoice {
  FlashPassChoice forward, backward;
  // Under auto, where wgmma could be offered: CudaBackendOptions::wgmma_trial's answer at this
  // shape, asked at its first plan ("" the kernels may run; else why not).
  std::optional<std::string> wgmma_trial_problem;
};

// Either kernel's saved tensors: v1 keeps probs; flash keeps lse and either its own copy of out
// or, when the caller keeps out (plan_attention's out_kept), where the forward wrote it.
class CudaAttentionState final : public AttentionState {
 public:
  // Only the tensors this state allocated: an unallocated Tensor has no shape, which numel()
  // counts as one element.
  size_t saved_bytes() const override {
    size_t bytes = 0;
    for (const Tensor* t : {&probs, &out, &lse, &inputs_bf16}) bytes += t->data ? t->bytes() : 0;
    return bytes;
  }
  // The tensor-core kernels' backward reads the forward's bf16 copies of q, k, v, kept here.
  bool keeps_inputs() const override { return kernel_kind == AttentionKernel::FlashTensorCores; }
  std::string kernel() const override {
    switch (kernel_kind) {
      case AttentionKernel::Materialized:
        return v1_precision == GemmPrecision::BF16
                   ? "materialized (cuBLASLt GEMMs on bf16 tensor cores + fp32 causal softmax)"
                   : "materialized (cuBLASLt fp32 GEMMs + causal softmax)";
      case AttentionKernel::FlashSimt:
        return "flash (fp32 SIMT)";
      case AttentionKernel::FlashTensorCores: {
        const std::string kernels =
            instruction == cuda::FlashMmaInstruction::Wgmma
                ? "flash_wgmma (bf16 tensor cores, wgmma; query tiles of "
            : wgmma_offered
                ? "flash_bf16 (bf16 tensor cores, mma.sync, or wgmma where it gives mma.sync's "
                  "bits and is faster; query tiles of "
                : "flash_bf16 (bf16 tensor cores, mma.sync; query tiles of ";
        if (tiles_timed) {
          return kernels + "64 or 128 rows in the forward" +
                 (shape.head_dim == 64 ? " and the dq pass" : ", 64 in the dq pass") +
                 ", the faster at this shape, timed at its first forward and backward" +
                 chosen_text() + ")";
        }
        return kernels + std::to_string(kFlashMmaForwardQueryTile) + " rows in the forward, " +
               std::to_string(flash_mma_query_pass_tile(shape.head_dim)) + " in the dq pass)";
      }
    }
    return "?";
  }
  // "; chosen: the forward on wgmma, 128-row query tiles, ..." once a pass has chosen.
  std::string chosen_text() const {
    std::string text;
    const std::pair<const char*, const FlashPassChoice*> passes[2] = {
        {"the forward", choice ? &choice->forward : nullptr},
        {"the backward", choice ? &choice->backward : nullptr}};
    for (const auto& [pass, c] : passes) {
      if (c == nullptr || !c->chosen) continue;
      text += (text.empty() ? "; chosen: " : ", ") + std::string(pass) + " on " +
              cuda::flash_variant_text(c->variant);
    }
    return text;
  }
  // The out the flash backward reads: the copy, or the caller's own.
  const float* flash_out() const {
    if (!out_kept) return static_cast<const float*>(out.data);
    GNMR_CHECK(caller_out != nullptr, "attention_backward before its attention_forward");
    return caller_out;
  }
  bool flash() const { return kernel_kind != AttentionKernel::Materialized; }
  AttentionKernel kernel_kind = AttentionKernel::Materialized;
  bool tiles_timed = false;  // the tensor-core kernels' query tiles: timed, not the defaults
  // The tensor-core kernels' instruction: wgmma for model.attention = flash_wgmma. Under auto,
  // with the tiles timed on a device that runs wgmma, the default of a choice that offers wgmma
  // too (wgmma_offered; flash_kernel_choice.h).
  cuda::FlashMmaInstruction instruction = cuda::FlashMmaInstruction::MmaSync;
  bool wgmma_offered = false;
  // The tensor-core kernels' choice at this shape, shared by the states of the shape
  // (CudaAttentionOps::flash_choices_).
  std::shared_ptr<FlashShapeChoice> choice;
  // v1's GEMMs: the run's GEMM precision when the state was planned (attention_v1_compute_type).
  GemmPrecision v1_precision = GemmPrecision::FP32;
  bool out_kept = false;
  Tensor probs;                       // v1: [B, H, T, T]
  Tensor out;                         // flash, out not kept: [B, T, H, hd]
  const float* caller_out = nullptr;  // flash, out kept: the last forward's out
  Tensor lse;                         // flash: [B, H, T]
  Tensor inputs_bf16;  // tensor cores: bf16 q, k, v (flash_attention_mma_inputs_bytes)
  AttentionShape shape{};
};

// Which kernels `shape` runs under `choice` on a device allowing `shared_limit` bytes of shared
// memory per block (opt-in). auto takes the flash kernels of the GEMMs' precision (tensor cores
// when `bf16_gemms`, else fp32 SIMT) where the head dim is theirs and their tiles fit, else the
// materialized kernels, and says so (`warned`: once per backend, not once per layer). An explicit
// flash choice whose head dim the kernels lack, or whose tiles do not fit, is an error naming the
// shape and the bytes, raised here, before the first step.
AttentionKernel attention_kernel_for(CudaAttention choice, bool bf16_gemms,
                                     const AttentionShape& shape, int64_t shared_limit,
                                     bool& warned);

// Whether the backend asks CudaBackendOptions::wgmma_trial at an attention shape: under
// attention auto with a trial to ask, the tiles timed, where the shape runs the tensor-core flash
// kernels (`kernel`), on a device that runs wgmma. Asked by the backend at the shape's first
// plan_attention and by run_wgmma_trial_before_backend before the backend exists.
bool asks_wgmma_trial(CudaAttention choice, bool has_trial, bool tiles_timed,
                      AttentionKernel kernel, bool device_runs_wgmma);

// CudaBackendOptions::flash_tiles as the backend runs them: Auto is Timed on a GPU.
bool flash_tiles_timed(FlashTiles tiles);

// The RoPE tables the tensor-core forward rotates q and k with (rope_attention_forward).
struct RopeTables {
  const float* cos;
  const float* sin;
};

// What the attention ops use of their backend.
struct AttentionContext {
  DeviceMemory& memory;
  cudaStream_t stream;
  OpTimer& timer;
  int64_t& sync_count;           // the backend's count of waits for the stream
  GemmPrecision gemm_precision;  // the run's now: v1's GEMMs run at it
};

// The attention ops of one CudaBackend, and what they keep from plan to plan: each shape's
// flash choice (shared by its layers' states), v1's kernels, the backward's scratch.
class CudaAttentionOps {
 public:
  // `gemm`'s handle and workspace run v1's GEMMs: it outlives these ops.
  CudaAttentionOps(const CudaBackendOptions& options, int device, int64_t shared_optin_bytes,
                   LtGemmRunner& gemm);

  std::unique_ptr<AttentionState> plan(const AttentionContext& ctx, const std::string& name,
                                       const AttentionShape& shape, bool out_kept);
  // attention_forward, with q and k rotated by `rope` as the tensor-core kernels copy them where
  // it is given (only for those kernels: state_of(saved).kernel_kind says).
  void forward(const AttentionContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
               const RopeTables* rope, Tensor& out, AttentionState& saved);
  void backward(const AttentionContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                const AttentionState& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                Tensor& dv);

  // `saved` as planned by these ops for shape `s`, else an internal error naming both shapes.
  static const CudaAttentionState& state_of(const AttentionState& saved, const AttentionShape& s);
  static CudaAttentionState& state_of(AttentionState& saved, const AttentionShape& s);

 private:
  static size_t scratch_bytes(const CudaAttentionState& state);
  void choose_flash_variant(const AttentionContext& ctx, FlashPassChoice& choice,
                            const CudaAttentionState& state, const char* pass,
                            const FlashVariant& ran, const std::vector<int64_t>& tiles,
                            const std::function<void(const FlashVariant&)>& run,
                            const std::vector<const Tensor*>& outputs);
  std::vector<uint64_t> output_digests(const AttentionContext& ctx,
                                       const std::vector<const Tensor*>& outputs);

  CudaAttention choice_;
  bool time_flash_tiles_ = false;  // CudaBackendOptions::flash_tiles
  std::function<std::string(const AttentionShape&)> wgmma_trial_;  // CudaBackendOptions
  int device_ = 0;
  int64_t shared_optin_bytes_ = 0;  // shared memory per block a kernel may opt in to
  bool warned_flash_fallback_ = false;
  using FlashChoiceKey = std::array<int64_t, 5>;  // batch, seq, heads, kv_heads, head_dim
  std::map<FlashChoiceKey, std::shared_ptr<FlashShapeChoice>> flash_choices_;
  Tensor digest_partials_;  // kBitsDigestPartials words for output_digests, where wgmma is offered
  MaterializedAttention v1_;
  DeviceScratch scratch_{"attention_scratch"};
};

}  // namespace gnmr::cuda
