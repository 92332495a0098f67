// Invariants that must hold for every controller under every option, on randomized and
// adversarial norm streams: the budget, per-kind caps, shared group paths, determinism.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "controller/controller.h"
#include "controller_test_util.h"

namespace gnmr {
namespace {

using testing::all_controllers;
using testing::is_recovery;

constexpr int kLayers = 3;
constexpr int kUnits = 7 * kLayers;
constexpr int kSteps = 80;

// Every option combination that can change a decision, cycled so the test stays fast:
// controller x granularity x budget x caps in full, ranking/history/schedule/lock rotated.
std::vector<ControllerOptions> option_matrix() {
  const std::vector<std::string> rankings = {"max_ratio", "sum_ratio", "gnmr", "delta"};
  const std::vector<std::string> schedules = {"constant", "linear", "cosine"};
  std::vector<ControllerOptions> matrix;
  int index = 0;
  for (const std::string& controller : all_controllers()) {
    for (const char* granularity : {"projection", "group"}) {
      for (double budget : {0.0, 1.0, 3.0, 5.0, 0.3}) {
        for (bool caps : {false, true}) {
          ControllerOptions o = testing::quick_options(controller, budget);
          o.granularity = granularity;
          o.ranking = rankings[index % 4];
          if (controller == "gnmr_no_delta" && o.ranking == "delta") o.ranking = "gnmr";
          o.history = index % 2 ? "capped" : "raw";
          o.threshold_schedule = schedules[index % 3];
          o.schedule_steps = 40;
          o.alpha_final = 1.2;
          o.lock_steps = index % 5;
          o.window = 1 + index % 4;
          o.warmup_steps = index % 7;
          o.seed = static_cast<uint64_t>(index);
          if (caps) o.per_kind_cap = {{"down", 1}, {"q", 0}, {"gate", 2}};
          matrix.push_back(o);
          ++index;
        }
      }
    }
  }
  return matrix;
}

std::vector<std::vector<std::vector<float>>> streams() {
  return {testing::noisy_stream(kUnits, kSteps, 1), testing::noisy_stream(kUnits, kSteps, 2),
          testing::exploding_stream(kUnits, kSteps),
          testing::flat_stream(kUnits, kSteps,
                               {{30, 0, testing::kNaN}, {31, 6, testing::kInf}, {32, 20, 0.0f}})};
}

TEST(ControllerPolicy, NeverExceedsBudgetUnderRandomAndAdversarialNormsForEveryOption) {
  const auto all_streams = streams();
  for (const ControllerOptions& o : option_matrix()) {
    for (size_t s = 0; s < all_streams.size(); ++s) {
      Controller first(o, kLayers), second(o, kLayers);
      const bool all_high = o.controller == "static_high";
      const auto caps = resolve_per_kind_caps(o.per_kind_cap);
      SCOPED_TRACE(controller_options_to_json(o).dump() + " stream " + std::to_string(s));
      ASSERT_EQ(first.initial_plan().active_count(), all_high ? kUnits : 0);
      for (int step = 0; step < kSteps; ++step) {
        const RoutingPlan plan = first.observe(step, all_streams[s][step]);
        ASSERT_EQ(plan, second.observe(step, all_streams[s][step])) << "determinism, step " << step;
        ASSERT_EQ(plan.active_count(), first.last_telemetry().active_units);
        if (all_high) {
          ASSERT_EQ(plan.active_count(), kUnits);
          continue;
        }
        ASSERT_LE(plan.active_count(), first.budget()) << "step " << step;
        std::array<int, kKindsPerLayer> per_kind{};
        for (int u = 0; u < kUnits; ++u)
          per_kind[static_cast<int>(unit_kind(u))] += is_recovery(plan, u);
        for (int k = 0; k < kKindsPerLayer; ++k) ASSERT_LE(per_kind[k], caps[k]) << "kind " << k;
        const DecisionUnits& units = first.decision_units();
        for (int d = 0; d < units.n_decision_units(); ++d) {
          for (UnitId u : units.members(d)) {
            ASSERT_EQ(plan.path[u], plan.path[units.members(d)[0]]) << "group " << d;
          }
        }
        if (step < o.warmup_steps) {
          ASSERT_EQ(plan.active_count(), 0);
        }
      }
    }
  }
}

TEST(ControllerPolicy, BudgetZeroNeverRecoversAnything) {
  for (const std::string& controller : all_controllers()) {
    if (controller == "static_high") continue;
    for (const auto& stream : streams()) {
      Controller c(testing::quick_options(controller, 0.0), kLayers);
      EXPECT_EQ(c.budget(), 0);
      for (int step = 0; step < kSteps; ++step) {
        ASSERT_EQ(c.observe(step, stream[step]).active_count(), 0) << controller;
      }
      EXPECT_EQ(c.run_telemetry().active_unit_steps, 0);
    }
  }
}

TEST(ControllerPolicy, FractionBudgetIsFilledWhenEveryUnitIsRisky) {
  Controller c(testing::quick_options("gnmr", 0.25), 4);  // floor(0.25 * 28) = 7
  EXPECT_EQ(c.budget(), 7);
  const auto stream = testing::exploding_stream(28, 20);
  for (int step = 0; step < 20; ++step) {
    const int active = c.observe(step, stream[step]).active_count();
    if (step >= 3) {
      EXPECT_EQ(active, 7) << step;  // Δ defined from step 3 (δ = 2)
    }
  }
}

TEST(ControllerPolicy, AllInvalidNormsKeepTheHistoryEmptyAndTheBudgetHeld) {
  Controller c(testing::quick_options("gnmr", 2), kLayers);
  std::vector<float> nan_norms(kUnits, testing::kNaN);
  for (int step = 0; step < 10; ++step) {
    EXPECT_EQ(c.observe(step, nan_norms).active_count(), 2);  // risk +inf, ties by id
    EXPECT_TRUE(is_recovery(c.current_plan(), 0));
    EXPECT_TRUE(is_recovery(c.current_plan(), 1));
  }
  EXPECT_EQ(c.last_telemetry().invalid_norms, kUnits);
}

}  // namespace
}  // namespace gnmr
