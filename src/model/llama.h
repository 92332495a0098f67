// LlamaModel: LLaMA-2 exactly as Hugging Face LlamaForCausalLM computes it, forward and
// backward over a Backend. Embedding -> L x [RMSNorm -> q,k,v -> RoPE -> causal GQA attention
// -> o -> residual -> RMSNorm -> gate,up -> SwiGLU -> down -> residual] -> RMSNorm -> lm_head
// (untied) -> fused softmax cross-entropy. All memory is allocated in the constructor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "controller/routing_plan.h"
#include "model/activations.h"
#include "model/gradient_ready_listener.h"
#include "model/param_table.h"
#include "model/projection_paths.h"
#include "precision/recipe.h"

namespace gnmr {

// The shape of every layer's attention in a model of `config` over micro-batches of
// `micro_batch` sequences of `seq_len` tokens (what each layer's plan_attention is given).
AttentionShape llama_attention_shape(const ModelConfig& config, int64_t micro_batch,
                                     int64_t seq_len);

// The parameters a model of `config` holds (LlamaModel::num_params without building it): the
// embedding, per layer two RMSNorm gains, q, k, v (n_kv_heads wide), o and the three MLP
// matrices, the final norm and the untied lm_head. `gnmr train --check` sizes a run by it.
int64_t llama_parameter_count(const ModelConfig& config);

// Whether a model holds its parameters' gradients: a training model does. One that only
// evaluates (forward_loss) needs none, and holds 4 bytes a parameter less, none of the
// backward's scratch, and one layer's activations, which all its layers share.
enum class ModelGradients : uint8_t { kHeld, kNone };

class LlamaModel {
 public:
  // Validates the shapes (Error(Config) naming the field) and allocates weights, gradients,
  // activations and scratch on `backend`, which must outlive the model. `recipe` (config
  // section "precision", src/precision/recipe.h) fixes each unit's low and recovery path;
  // the default is fp32 (projections at train.gemm_precision). Set the backend's
  // GemmPrecision before constructing: bf16 GEMMs then get a per-step weight cache.
  // `sharing`: whether q, k, v (gate, up) on the same deterministic saved spec keep one
  // quantized copy of their input (the default) or one each (tests compare the two).
  // `flat_elements_multiple`: the flat weight and gradient buffers are allocated rounded up
  // to a multiple of it (zero padding), so ZeRO-1 can cut them into equal shards
  // (train/zero_shards.h); 1 allocates exactly ParamTable::flat_size. `gradients` kNone: an
  // evaluation model (above): flat_grads() and the parameters' grad are empty, and
  // forward_backward and zero_grads refuse.
  LlamaModel(const ModelConfig& config, Backend& backend, int micro_batch, int seq_len,
             const PrecisionRecipe& recipe = PrecisionRecipe{},
             SavedInputSharing sharing = SavedInputSharing::kShared,
             int64_t flat_elements_multiple = 1, ModelGradients gradients = ModelGradients::kHeld);
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  int micro_batch() const { return micro_batch_; }
  int seq_len() const { return seq_len_; }
  int64_t tokens_per_micro_batch() const { return static_cast<int64_t>(micro_batch_) * seq_len_; }

  const std::vector<ParamInfo>& params() const { return table_.params; }
  const std::vector<ProjectionUnit>& units() const { return table_.units; }  // 7 per layer
  int64_t num_params() const;                                                // without padding
  // All weights / all gradients as one fp32 tensor each (params are views into them at
  // ParamInfo::offset; padding between them stays zero). For all-reduce and checkpoints.
  const Tensor& flat_weights() const { return flat_weights_; }
  const Tensor& flat_grads() const { return flat_grads_; }

  // normal(0, init_std) for matrices, 1 for norm gains; counter-based from (seed, param
  // index, element), so independent of thread count.
  void init_weights(uint64_t seed);

  // tokens, targets: host int32 [micro_batch * seq_len]; target -1 = ignored position; the
  // buffers may be reused as soon as the call returns.
  // Forward and backward; ADDS loss_scale * d(mean loss)/d(theta) to the gradients and the
  // mean loss over the non-ignored targets (as a float, widened) to loss_sum, an f64 [1] in
  // backend memory: no readback, so micro-steps queue back to back.
  void forward_backward(const int32_t* tokens, const int32_t* targets, float loss_scale,
                        Tensor& loss_sum);
  // The same, returning this micro-batch's mean loss at once (a readback; tests and tools).
  float forward_backward(const int32_t* tokens, const int32_t* targets, float loss_scale);
  // Mean loss, gradients untouched (evaluation; a readback).
  float forward_loss(const int32_t* tokens, const int32_t* targets);
  void zero_grads();
  // Who hears, during each following backward, which parameters' gradients are final (nullptr:
  // nobody, the default). Set it for the last micro-step of an accumulation window only: in
  // the earlier ones the gradients are still partial sums. Not owned.
  void set_gradient_ready_listener(GradientReadyListener* listener) { ready_listener_ = listener; }

  // ---- routing (docs/DESIGN.md §2 step 2) ----
  const PrecisionRecipe& recipe() const { return paths_->recipe(); }
  // The path of every unit from the next forward on (one per unit, by unit id; Error(Runtime)
  // on a size mismatch). No allocation. Default: every unit Low. Ignored by fp32 / bf16.
  void set_routing(const RoutingPlan& plan) { paths_->set_routing(plan); }
  const RoutingPlan& routing() const { return paths_->routing(); }
  // Per-step counts and saved-activation bytes of the current plan.
  const RoutingStats& routing_stats() const { return paths_->stats(); }
  // The training step, for stochastic rounding keyed by (precision.seed, step, unit).
  void set_step(int64_t step) { paths_->set_step(step); }
  // Call after writing weights (optimizer, checkpoint load) when no zero_grads() follows
  // before the next forward_backward: the prepared (rounded / quantized) weights are redone.
  void weights_changed() { paths_->invalidate_weights(); }

  // Training FLOPs per token: 6 * (matmul params, lm_head included, embedding excluded)
  // + 12 * n_layers * dim * seq_len for q k^T and P v (forward + backward, the full T x T
  // products, no causal discount — the PaLM appendix-B convention used for MFU).
  int64_t flops_per_token() const;
  // The attention kernels the backend planned for the layers (AttentionState::kernel; every
  // layer has the same shape, so the same kernels).
  std::string attention_kernel() const;

 private:
  // The one path every projection unit takes: y = x W_u^T, on the unit's path of the current
  // plan (paths_). The unit's weight gradient reads x as its own path saved it (e.g. a
  // quantized copy of x, shared with the units of x on the same deterministic spec), so
  // units sharing x each keep their own precision.
  void project_forward(const ProjectionUnit& unit, const Tensor& x, Tensor& y);
  // dW_u += dy^T saved_input; dx = dy W_u (dx += when accumulate_dx).
  void project_backward(const ProjectionUnit& unit, Tensor& dy, Tensor& dx, bool accumulate_dx);

  int upload_batch(const int32_t* tokens, const int32_t* targets);  // returns valid targets
  // Upload, forward and backward, the losses left in act_.losses; returns the valid targets.
  int forward_backward_pass(const int32_t* tokens, const int32_t* targets, float loss_scale);
  void forward(bool save_for_backward);  // through the logits
  void backward(float dloss);  // the loss from the logits, its gradient (x dloss), and back
  Tensor heads_view(const Tensor& t, int heads) const;  // [N, heads*hd] -> [B, T, heads, hd]
  const ProjectionUnit& unit(int layer, ProjectionKind kind) const;
  // act_.losses read back and averaged, in the arithmetic of Backend::accumulate_mean_loss.
  float read_mean_loss(int valid_targets);
  void params_ready(int first_param, int last_param) {
    if (ready_listener_ != nullptr) ready_listener_->on_params_ready(first_param, last_param);
  }
  // GNMR_CHECK that the model was built with ModelGradients::kHeld, naming `call`.
  void check_holds_gradients(const char* call) const;

  ModelConfig config_;
  Backend& backend_;
  int micro_batch_;
  int seq_len_;
  ParamTable table_;
  Tensor flat_weights_, flat_grads_;
  Activations act_;
  GradientScratch scratch_;
  std::unique_ptr<ProjectionPaths> paths_;
  bool save_for_backward_ = false;  // during forward(): quantize what the backward reads
  int micro_step_ = 0;              // forward_backward calls since zero_grads()
  GradientReadyListener* ready_listener_ = nullptr;
  std::vector<int32_t> host_targets_;
  std::vector<float> host_losses_;
};

}  // namespace gnmr
