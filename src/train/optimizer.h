// AdamW over the model's fp32 master weights (decoupled weight decay, as torch.optim.AdamW).
// The moments live in backend memory; the update itself is the backend's adamw_update_batch op
// (every tensor in one call).
#pragma once

#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/llama.h"

namespace gnmr {

// The hyperparameters of one AdamW update of a tensor from the run's config: learning rate lr
// at `step` (1-based), weight decay where the tensor takes it (ParamInfo::weight_decay). AdamW
// and ZeroAdamW (zero_optimizer.h) build every update from this.
AdamWStep adamw_step(const TrainConfig& train, double lr, int64_t step, bool weight_decay);

class AdamW {
 public:
  AdamW(Backend& backend, const std::vector<ParamInfo>& params, const TrainConfig& train);

  // One update of every parameter. step: 1-based (bias correction); clip: f32 [2] in backend
  // memory as Backend::global_norm_clip writes it: clip[0] multiplies the gradient (global-norm
  // clipping folded into the update), clip[1] == 0 leaves every parameter and moment as it
  // was (a non-finite step). Nothing is read back.
  void step(double lr, const Tensor& clip, int64_t step);

  // Moments for checkpoints: first (m) and second (v) moment of parameter i.
  Tensor& first_moment(size_t i) { return first_moment_[i]; }
  Tensor& second_moment(size_t i) { return second_moment_[i]; }

 private:
  Backend& backend_;
  const std::vector<ParamInfo>& params_;
  TrainConfig train_;
  std::vector<Tensor> first_moment_;
  std::vector<Tensor> second_moment_;
};

}  // namespace gnmr
