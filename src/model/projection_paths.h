// ProjectionPaths: the routing half of the projection op (docs/DESIGN.md §2 step 2, §4). It keeps
// the plan, the path each unit takes this step, the stochastic-rounding key and the
// statistics; the backend executes the path (Backend::projection_forward / _backward,
// swiglu_projections_backward), with the memory both paths of each unit need planned once, at
// construction (Backend::plan_projection). LlamaModel is the only caller. The backend's
// prepared weights are dropped (invalidate_weights) on zero_grads(), init_weights(),
// forward_loss() and LlamaModel::weights_changed(); a caller that writes weights between
// zero_grads() and forward_backward() must call weights_changed().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "controller/routing_plan.h"
#include "model/param_table.h"
#include "precision/recipe.h"

namespace gnmr {

// What the current routing plan costs, per step (one micro-batch's saved activations).
struct RoutingStats {
  int units_low = 0;       // units on the low path (0 for a recipe without one)
  int units_recovery = 0;  // units on the recovery path (all units for fp32 / bf16)
  // Bytes the projections keep for their weight gradients: the quantized copies (packed
  // codes + fp32 scales), a unit's own or, once per layer activation and spec, the one the
  // units of that activation on paths with the same deterministic spec share; and, once per
  // layer activation, the fp32 input (N x in x 4) when the path of a unit reading it needs
  // it; summed over layers.
  size_t saved_activation_bytes = 0;
  // What each unit's weight gradient reads (its own copy, or the quantized copy or fp32
  // input it may share with the other units of that input), by unit id.
  std::vector<size_t> saved_bytes_per_unit;
  // The memory planned for them, both paths of every unit: the backend's saved-copy buffers
  // as allocated plus the fp32 inputs kept per layer (input_kept). Not below
  // saved_activation_bytes under any plan.
  size_t planned_saved_activation_bytes = 0;
};

// The layer activation a projection unit reads; units reading the same one share it.
enum class UnitInput : uint8_t {
  kAttentionNorm,  // xn_attn: q, k, v
  kAttentionOut,   // att: o
  kMlpNorm,        // xn_mlp: gate, up
  kSwigluOut,      // act: down
};
constexpr int kInputsPerLayer = 4;
UnitInput unit_input(ProjectionKind kind);

// Whether the units reading one layer activation (q, k, v; gate, up) keep one quantized copy
// of it per deterministic saved spec (kShared, the default; ProjectionShape::shared_saved_specs)
// or one copy each (kPerUnit: what they computed before, to compare against). Stochastic
// rounding keeps one copy per unit either way: each unit's codes depend on its own RNG key.
enum class SavedInputSharing : uint8_t { kShared, kPerUnit };

class ProjectionPaths {
 public:
  // table: the model's parameter table with weight/grad views set; tokens: N per micro-batch.
  ProjectionPaths(const PrecisionRecipe& recipe, Backend& backend, const ParamTable& table,
                  int64_t tokens, SavedInputSharing sharing = SavedInputSharing::kShared);
  ~ProjectionPaths();

  const PrecisionRecipe& recipe() const { return recipe_; }
  // One path per unit; Error(Runtime) if the size differs from the unit count. No allocation.
  void set_routing(const RoutingPlan& plan);
  const RoutingPlan& routing() const { return plan_; }
  const RoutingStats& stats() const { return stats_; }
  // The spec unit `id` runs under the current plan (recovery when the recipe has no low path).
  const PathSpec& path_of(int id) const;
  // The unit leading unit `id`'s input group (ProjectionShape::input_leader): the first unit,
  // in unit order (the forward's), of its layer reading its input; -1 when that is `id` itself.
  int input_leader(int id) const;
  // Whether layer `layer`'s activation `input` must outlive its forward: the path (low or
  // recovery) of some unit reading it has a backward that reads the fp32 input itself.
  // Otherwise it may live in per-step scratch shared by all layers.
  bool input_kept(int layer, UnitInput input) const;

  // Stochastic rounding key: (recipe seed, step, unit + n_units * micro_step).
  void set_step(int64_t step) { step_ = step; }
  void set_micro_step(int micro_step) { micro_step_ = micro_step; }
  void invalidate_weights() { backend_.invalidate_prepared_weights(); }
  // Every unit's weight prepared for its path under the current plan, all at once
  // (Backend::prepare_projection_weights), before a forward's first GEMM reads one.
  void prepare_weights();

  // y = x W^T; when save_for_backward, keeps what the weight gradient will read.
  void forward(const ProjectionUnit& unit, const Tensor& x, Tensor& y, bool save_for_backward);
  // dW += dy^T saved; dx = dy W (dx += when accumulate_dx). dy is left unchanged.
  void backward(const ProjectionUnit& unit, Tensor& dy, Tensor& dx, bool accumulate_dx);
  // RoPE's backward and the backward of the unit (q or k) whose output it rotated
  // (Backend::rope_projection_backward): dx = rope^T(dy) W (+= when accumulate_dx). dy is
  // workspace, not necessarily rotated.
  void rope_backward(const ProjectionUnit& unit, Tensor& dy, const Tensor& cos, const Tensor& sin,
                     Tensor& dx, bool accumulate_dx);
  // A residual add, the RMSNorm of its result, and the forward of the unit leading the norm's
  // input group, q or gate (Backend::residual_rmsnorm_projection_forward):
  // sum = a + b, out = rmsnorm(sum) (rstd kept), y = out W^T.
  void residual_rmsnorm_forward(const ProjectionUnit& first_unit, const Tensor& a, const Tensor& b,
                                Tensor& sum, const Tensor& norm_weight, float eps, Tensor& out,
                                Tensor& rstd, Tensor& y, bool save_for_backward);
  // The SwiGLU forward and the forward of the down unit reading its output
  // (Backend::swiglu_projection_forward): out = silu(gate) * up, y = out W_down^T.
  void swiglu_forward(const ProjectionUnit& down_unit, const Tensor& gate, const Tensor& up,
                      Tensor& out, Tensor& y, bool save_for_backward);
  // The RMSNorm's backward into the residual gradient dx (dx +=, dweight +=) and the backward
  // of the unit whose output the residual add took, o or down, from it
  // (Backend::rmsnorm_projection_backward): d_in = dx W (+= when accumulate_dx).
  void rmsnorm_backward(const ProjectionUnit& unit, const Tensor& x, const Tensor& norm_weight,
                        const Tensor& rstd, const Tensor& dout, Tensor& dx, Tensor& dweight,
                        Tensor& d_in, bool accumulate_dx);
  // The SwiGLU backward and the backward of the gate and up units that read its gradients
  // (Backend::swiglu_projections_backward): dx = dgate W_gate + dup W_up. dgate and dup are
  // workspace, not necessarily written.
  void swiglu_backward(const ProjectionUnit& gate_unit, const ProjectionUnit& up_unit,
                       const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                       Tensor& dup, Tensor& dx);

  // The lm_head (not a unit: always train.gemm_precision, kBackendGemm) through the same op.
  void lm_head_forward(const Tensor& x, Tensor& logits, bool save_for_backward);
  // The loss (losses), its gradient (dloss * (softmax - onehot)) and the lm_head's backward
  // from it into dx (Backend::cross_entropy_projection_backward). logits is workspace: it holds
  // the gradient afterwards, or (fused) the logits still.
  void lm_head_loss_backward(Tensor& logits, const Tensor& targets, Tensor& losses, float dloss,
                             Tensor& dx);

 private:
  void recompute_stats();
  // The stochastic-rounding key of unit u's saved codes this micro-step.
  RngKey rounding_key(const ProjectionUnit& u) const;
  int64_t input_width(int layer, UnitInput input) const;  // columns of that activation
  // Which units share saved copies of their input, and of which specs (shared_specs_).
  void plan_sharing(SavedInputSharing sharing);
  // The shared copy unit `id`'s current path keeps its codes in (an index into
  // shared_specs_[shared_group_[id]]), or -1.
  int shared_copy(int id) const;

  PrecisionRecipe recipe_;
  Backend& backend_;
  ParamTable table_;  // a copy: the views point into the model's flat buffers
  int64_t tokens_;
  RoutingPlan plan_;
  RoutingStats stats_;
  int64_t step_ = 0;
  int micro_step_ = 0;
  std::vector<std::unique_ptr<ProjectionState>> states_;  // by unit id
  // By unit id: the index of its input's sharing group, or -1. By group: the shared specs
  // (as saved, cut to the width) and the unit planned first (the leader).
  std::vector<int> shared_group_;
  std::vector<std::vector<GroupwiseSpec>> shared_specs_;
  std::vector<int> shared_leader_;
  std::unique_ptr<ProjectionState> lm_head_state_;
  PathSpec lm_head_path_;  // kBackendGemm
};

}  // namespace gnmr
