// Shared helpers for the controller tests: option presets and norm streams.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "controller/controller.h"

namespace gnmr::testing {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Bit equality of two scores, so NaN == NaN and +0 != -0: bit-exact resume and replay checks.
inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Small, fast-reacting options: decisions from step 0 once δ = 2 windows are full
// (the 4th observation), T_lock = 3.
inline ControllerOptions quick_options(const std::string& controller = "gnmr",
                                       double max_active = 2) {
  ControllerOptions o;
  o.controller = controller;
  o.max_active = max_active;
  o.window = 2;
  o.lock_steps = 3;
  o.warmup_steps = 0;
  return o;
}

inline const std::vector<std::string>& all_controllers() {
  static const std::vector<std::string> names = {
      "gnmr", "static_low", "static_high", "random", "topk_norm", "gnmr_no_delta", "gnmr_no_lock"};
  return names;
}

// norms[step][unit]: every unit at 1.0, with `spikes` = {step, unit, value} overrides.
struct Spike {
  int64_t step;
  int unit;
  float value;
};
inline std::vector<std::vector<float>> flat_stream(int n_units, int steps,
                                                   const std::vector<Spike>& spikes = {}) {
  std::vector<std::vector<float>> norms(static_cast<size_t>(steps),
                                        std::vector<float>(static_cast<size_t>(n_units), 1.0f));
  for (const Spike& s : spikes) norms[s.step][s.unit] = s.value;
  return norms;
}

// Log-normal noise with occasional spikes (x20), NaN, Inf and zero norms.
inline std::vector<std::vector<float>> noisy_stream(int n_units, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::uniform_real_distribution<float> event(0.0f, 1.0f);
  std::vector<std::vector<float>> norms(static_cast<size_t>(steps));
  for (auto& row : norms) {
    for (int u = 0; u < n_units; ++u) {
      float n = (1.0f + 0.1f * u) * std::exp(noise(rng));
      float e = event(rng);
      if (e < 0.03f)
        n *= 20.0f;
      else if (e < 0.035f)
        n = kNaN;
      else if (e < 0.038f)
        n = kInf;
      else if (e < 0.041f)
        n = 0.0f;
      row.push_back(n);
    }
  }
  return norms;
}

// Adversarial: every unit grows x2 per step, so every unit is risky at every step.
inline std::vector<std::vector<float>> exploding_stream(int n_units, int steps) {
  std::vector<std::vector<float>> norms(static_cast<size_t>(steps));
  float n = 1.0f;
  for (auto& row : norms) {
    row.assign(static_cast<size_t>(n_units), n);
    n = std::min(n * 2.0f, 1e30f);
  }
  return norms;
}

inline bool is_recovery(const RoutingPlan& plan, int unit) {
  return plan.path[unit] == Path::Recovery;
}

}  // namespace gnmr::testing
