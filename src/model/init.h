// Weight initialization: counter-based, so every element depends only on (seed, parameter
// index, element index) — never on thread count or the order parameters are visited.
#pragma once

#include <cstdint>

namespace gnmr {

// out[i] ~ normal(0, std) for element i of parameter `param_index` (Box-Muller on two
// uniforms from a splitmix64 hash of the counter).
void fill_normal_counter_based(uint64_t seed, uint64_t param_index, float std, float* out,
                               int64_t count);

}  // namespace gnmr
