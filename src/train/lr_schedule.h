// Learning-rate schedule: linear warm-up, then cosine decay to lr * min_lr_ratio
// (the GaLore / LLaMA pretraining schedule: warm-up 10%, cosine to 10%).
#pragma once

#include <cstdint>

#include "config/config.h"

namespace gnmr {

// step: 0-based optimizer step in [0, train.steps).
double learning_rate_at(const TrainConfig& train, int64_t step);

}  // namespace gnmr
