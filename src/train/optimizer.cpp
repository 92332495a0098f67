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

void AdamW::step(double lr, const Tensor& clip, int64_t step) {
  std::vector<AdamWUpdate> updates;
  updates.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    AdamWStep s;
    s.lr = float(lr);
    s.beta1 = float(train_.beta1);
    s.beta2 = float(train_.beta2);
    s.eps = float(train_.eps);
    s.weight_decay = params_[i].weight_decay ? float(train_.weight_decay) : 0.0f;
    s.step = step;
    updates.push_back(
        AdamWUpdate{params_[i].weight, params_[i].grad, first_moment_[i], second_moment_[i], s});
  }
  backend_.adamw_update_batch(updates, clip);
}

}  // namespace gnmr
