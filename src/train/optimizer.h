// AdamW over the model's fp32 master weights (decoupled weight decay, as torch.optim.AdamW).
// The moments live in backend memory; the update itself is the backend's adamw_update op.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/llama.h"

namespace gnmr {

class AdamW {
 public:
  AdamW(Backend& backend, const std::vector<ParamInfo>& params, const TrainConfig& train);

  // One update of every parameter. step: 1-based (bias correction); clip_factor multiplies
  // the gradient (global-norm clipping folded into the update).
  void step(double lr, float clip_factor, int64_t step);

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
