// ZeRO-1 AdamW (docs/DESIGN.md §7): the optimizer state is sharded over the data-parallel
// ranks, the weights and gradients are not. Rank r keeps the AdamW moments of shard r only
// (train/zero_shards.h; 2 × 4 bytes × shard_elements instead of 2 × 4 bytes × every
// parameter) and updates only that shard of the fp32 master weights. Per step:
//   reduce_gradients  reduce-scatter of the flat gradient (rank order, communicator.h); or,
//                     with dist.bucket_mb > 0, the same per bucket overlapped with backward
//                     (OverlappedGradientSum, kReduceScatter), the same bits
//   average_gradients × 1/world on the own shard: the mean gradient of the shard
//   sum_squares       every parameter's squared gradient norm: this rank's partial sum over
//                     its piece of the parameter, all-reduced as doubles, so every rank holds
//                     the same values for the global clip and the controller
//   step              AdamW on the shard's pieces (Backend::adamw_update_batch: one call)
//   gather_weights    all-gather of the flat weights: every rank ends with the same bits
// The model's flat buffers must be padded to layout().padded_elements() (LlamaModel's
// flat_elements_multiple).
#pragma once

#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "train/zero_shards.h"

namespace gnmr {

class ZeroAdamW {
 public:
  ZeroAdamW(Backend& backend, Communicator& comm, const LlamaModel& model,
            const TrainConfig& train);

  void reduce_gradients();
  void average_gradients();
  // out_per_param: f64 [params] in backend memory (all-reduced by the communicator in place).
  void sum_squares(Tensor& out_per_param);
  // As AdamW::step (clip: f32 [2] from Backend::global_norm_clip), on this rank's shard.
  void step(double lr, const Tensor& clip, int64_t step);
  void gather_weights();

  const ZeroShardLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  // This rank's moments: f32 [shard_elements], element e belongs to flat element
  // layout().shard_begin(rank()) + e (padding and gaps stay zero).
  Tensor& first_moment_shard() { return first_moment_; }
  Tensor& second_moment_shard() { return second_moment_; }
  size_t state_bytes() const { return first_moment_.bytes() + second_moment_.bytes(); }

 private:
  Backend& backend_;
  Communicator& comm_;
  const std::vector<ParamInfo>& params_;
  TrainConfig train_;
  int rank_;
  ZeroShardLayout layout_;
  Tensor flat_weights_, flat_grads_;
  Tensor own_grads_;  // this rank's shard of flat_grads_
  Tensor first_moment_, second_moment_;
  // Per parameter: its gradient elements in this shard (empty when it has none), for
  // sum_squares; per piece: weight, gradient and moment views for step.
  std::vector<Tensor> grad_in_shard_;
  struct PieceViews {
    Tensor weight, grad, first_moment, second_moment;
    bool weight_decay;
  };
  std::vector<PieceViews> pieces_;
};

}  // namespace gnmr
