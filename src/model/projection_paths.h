// ProjectionPaths: runs one projection unit (y = x W^T and its backward) on the path the
// routing plan gives it this step, as the precision recipe (src/precision/recipe.h) defines
// that path. LlamaModel::project_forward / project_backward are the only callers.
//
// Planned memory (allocated once, in the constructor, never in a step):
//  - packed saved activations: per unit, room for the larger of its two paths'
//    packed_bytes + scales (recipe actq); the bytes a step really keeps are in RoutingStats;
//  - a prepared-weight cache: each projection weight (and the lm_head under bf16 GEMMs) as its
//    GEMM reads it (bf16-rounded, fine-grained fp or int8 fake-quantized), made once per step on
//    first use and reused by every micro-step's forward and input-gradient GEMMs;
//  - two GEMM-input scratch buffers, x: [N, max(D, F)], dy: [N, max(D, F)].
// The cache is dropped (invalidate_weights) on zero_grads(), init_weights(), forward_loss()
// and LlamaModel::weights_changed(); a caller that writes weights between zero_grads() and
// forward_backward() must call weights_changed().
#pragma once

#include <cstddef>
#include <cstdint>
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
  // Bytes the projections keep for their weight gradients: packed codes + fp32 scales for a
  // quantized path, the fp32 activation (N x in x 4) otherwise; summed over units.
  size_t saved_activation_bytes = 0;
  std::vector<size_t> saved_bytes_per_unit;  // [n_units], by unit id
};

class ProjectionPaths {
 public:
  // table: the model's parameter table with weight/grad views set; tokens: N per micro-batch.
  ProjectionPaths(const PrecisionRecipe& recipe, Backend& backend, const ParamTable& table,
                  int64_t tokens);

  const PrecisionRecipe& recipe() const { return recipe_; }
  // One path per unit; Error(Runtime) if the size differs from the unit count. No allocation.
  void set_routing(const RoutingPlan& plan);
  const RoutingPlan& routing() const { return plan_; }
  const RoutingStats& stats() const { return stats_; }
  // The spec unit `id` runs under the current plan (recovery when the recipe has no low path).
  const PathSpec& path_of(int id) const;

  // Stochastic rounding key: (recipe seed, step, unit + n_units * micro_step).
  void set_step(int64_t step) { step_ = step; }
  void set_micro_step(int micro_step) { micro_step_ = micro_step; }
  void invalidate_weights();

  // y = x W^T; when save_for_backward, keeps what the weight gradient will read.
  void forward(const ProjectionUnit& unit, const Tensor& x, Tensor& y, bool save_for_backward);
  // dW += dy^T saved; dx = dy W (dx += when accumulate_dx).
  void backward(const ProjectionUnit& unit, const Tensor& dy, Tensor& dx, bool accumulate_dx);

  // The lm_head GEMMs (not a unit: always train.gemm_precision), sharing the weight cache.
  void lm_head_forward(const Tensor& x, Tensor& logits);
  // dlogits may be overwritten (rounded in place under bf16 GEMMs).
  void lm_head_backward(const Tensor& x, Tensor& dlogits, Tensor& dx);

 private:
  // How a prepared weight was made; kNone = not prepared this step.
  enum class Treatment : uint8_t { kNone, kBf16, kFineGrainedFp, kInt8PerRow };
  struct WeightSlot {
    Tensor prepared;  // view into weight_cache_, or empty when not cached
    Treatment treatment = Treatment::kNone;
    FpFormat format = FpFormat::kE4M3;
    int64_t tile = 0;
  };

  bool backend_bf16() const { return backend_.gemm_precision() == GemmPrecision::BF16; }
  // The weight as a GEMM of this treatment reads it (from the cache, made on first use).
  // nullptr when the weight has no cache slot (bf16 GEMMs switched on after construction).
  const Tensor* prepared_weight(int param_index, Treatment treatment, FpFormat format,
                                int64_t tile);
  // The GEMMs of one path; a backend-precision path under bf16 GEMMs uses the bf16 cache.
  void gemm_forward(int param_index, const PathSpec& path, const Tensor& x, Tensor& y);
  void gemm_backward_input(int param_index, const PathSpec& path, const Tensor& dy, Tensor& dx,
                           bool accumulate_dx);
  void gemm_backward_weight(const ProjectionUnit& unit, const PathSpec& path, const Tensor& dy);
  Tensor scratch(Tensor& buffer, const Tensor& like) const;  // a view of buffer shaped as like
  GroupwiseSpec unit_spec(const PathSpec& path, int64_t cols) const;
  void recompute_stats();

  PrecisionRecipe recipe_;
  Backend& backend_;
  ParamTable table_;  // a copy: the views point into the model's flat buffers
  int64_t tokens_;
  RoutingPlan plan_;
  RoutingStats stats_;
  int64_t step_ = 0;
  int micro_step_ = 0;
  std::vector<Tensor> saved_input_;      // by unit id: the activation view the forward read
  std::vector<Tensor> packed_, scales_;  // by unit id: views into packed_storage_/scale_storage_
  Tensor packed_storage_, scale_storage_, weight_cache_, gemm_x_, gemm_dy_;
  std::vector<WeightSlot> slots_;  // by param index
};

}  // namespace gnmr
