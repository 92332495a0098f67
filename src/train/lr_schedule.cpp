#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace gnmr {

double learning_rate_at(const TrainConfig& train, int64_t step) {
  const double peak = train.lr;
  const double floor = train.lr * train.min_lr_ratio;
  if (step < train.warmup_steps) return peak * double(step + 1) / double(train.warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, train.steps - train.warmup_steps);
  const double progress = std::min(1.0, double(step - train.warmup_steps) / double(decay_steps));
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace gnmr
