#include "train/optimizer.h"

namespace gnmr {

AdamW::AdamW(Backend& backend, const std::vector<ParamInfo>& params, const TrainConfig& train)
    : backend_(backend), params_(params), train_(train) {
  for (const auto& p : params_) {
    first_moment_.push_back(
        backend_.allocate("adamw.m." + p.name, p.shape, DType::F32, MemoryRole::OptimizerState));
    second_moment_.push_back(
        backend_.allocate("adamw.v." + p.name, p.shape, DType::F32, MemoryRole::OptimizerState));
    backend_.fill_zero(first_moment_.back());
    backend_.fill_zero(second_moment_.back());
  }
}

AdamWStep adamw_step(const TrainConfig& train, double lr, int64_t step, bool weight_decay) {
  AdamWStep s;
  s.lr = float(lr);
  s.beta1 = float(train.beta1);
  s.beta2 = float(train.beta2);
  s.eps = float(train.eps);
  s.weight_decay = weight_decay ? float(train.weight_decay) : 0.0f;
  s.step = step;
  return s;
}

void AdamW::step(double lr, const Tensor& clip, int64_t step) {
  std::vector<AdamWUpdate> updates;
  updates.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    updates.push_back(AdamWUpdate{params_[i].weight, params_[i].grad, first_moment_[i],
                                  second_moment_[i],
                                  adamw_step(train_, lr, step, params_[i].weight_decay)});
  }
  backend_.adamw_update_batch(updates, clip);
}

}  // namespace gnmr
