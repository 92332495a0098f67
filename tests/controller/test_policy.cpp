// The GNMR policy on hand-built streams: warm-up, spike -> recovery -> release after T_lock,
// lock refresh and count-down, tie-break, per-kind caps, group granularity, invalid norms.
#include <gtest/gtest.h>

#include <cmath>

#include "controller/controller.h"
#include "controller_test_util.h"

namespace gnmr {
namespace {

using testing::flat_stream;
using testing::is_recovery;
using testing::quick_options;

constexpr int kLayers = 2;
constexpr int kUnits = 7 * kLayers;

// Runs the stream from step 0 and returns the plan returned by each observation.
std::vector<RoutingPlan> run(Controller& c, const std::vector<std::vector<float>>& norms) {
  std::vector<RoutingPlan> plans;
  for (size_t step = 0; step < norms.size(); ++step) plans.push_back(c.observe(step, norms[step]));
  return plans;
}

TEST(ControllerWarmup, NoDecisionsUntilGnmrAndDeltaAreDefined) {
  // δ = 2: GNMR from observation 2 (step 1), Δ-GNMR from observation δ + 2 = 4 (step 3).
  Controller early(quick_options(), kLayers);
  auto plans = run(early, flat_stream(kUnits, 3, {{2, 5, 50.0f}}));
  EXPECT_EQ(plans[2].active_count(), 0);
  EXPECT_FALSE(early.last_telemetry().units[5].delta == early.last_telemetry().units[5].delta);

  Controller on_time(quick_options(), kLayers);
  plans = run(on_time, flat_stream(kUnits, 4, {{3, 5, 50.0f}}));
  EXPECT_TRUE(is_recovery(plans[3], 5));
  EXPECT_EQ(plans[3].active_count(), 1);
}

TEST(ControllerWarmup, NoDecisionsBeforeWarmupSteps) {
  ControllerOptions o = quick_options();
  o.warmup_steps = 20;
  Controller c(o, kLayers);
  auto plans = run(c, flat_stream(kUnits, 21, {{19, 5, 10.0f}, {20, 6, 10.0f}}));
  for (int step = 0; step < 20; ++step) EXPECT_EQ(plans[step].active_count(), 0) << step;
  EXPECT_TRUE(is_recovery(plans[20], 6));
  EXPECT_EQ(c.initial_plan().active_count(), 0);
}

// Exact lock semantics (policy.h): a unit that spikes at observation t is in the plans
// returned at t, t+1, .., t+T_lock and released by the plan returned at t+T_lock+1.
TEST(ControllerLock, SpikedUnitIsRecoveredNextStepAndReleasedAfterLockStepsCalmSteps) {
  for (int lock_steps : {0, 1, 3, 6}) {
    ControllerOptions o = quick_options();
    o.lock_steps = lock_steps;
    Controller c(o, kLayers);
    const int spike = 10;
    auto norms = flat_stream(kUnits, 30, {{spike, 5, 10.0f}});
    for (int step = 0; step < 30; ++step) {
      RoutingPlan plan = c.observe(step, norms[step]);
      if (step > spike) {
        EXPECT_EQ(c.last_telemetry().exceeding_units, 0) << "calm at " << step;
      }
      const bool expected = step >= spike && step <= spike + lock_steps;
      EXPECT_EQ(is_recovery(plan, 5), expected) << "T_lock " << lock_steps << " step " << step;
      EXPECT_EQ(plan.active_count(), expected ? 1 : 0);
      if (step >= spike && step <= spike + lock_steps) {
        EXPECT_EQ(c.locks()[5], lock_steps - (step - spike));  // T_lock, T_lock-1, .., 0
      }
    }
  }
}

TEST(ControllerLock, LockIsRefreshedWhileTheUnitStaysRisky) {
  Controller c(quick_options(), kLayers);  // T_lock = 3
  auto norms = flat_stream(kUnits, 25, {{10, 5, 10.0f}, {12, 5, 10.0f}});
  for (int step = 0; step < 25; ++step) {
    RoutingPlan plan = c.observe(step, norms[step]);
    if (step == 12) {
      EXPECT_EQ(c.locks()[5], 3);  // refreshed by the second spike
    }
    const bool expected = step >= 10 && step <= 12 + 3;
    EXPECT_EQ(is_recovery(plan, 5), expected) << "step " << step;
  }
}

TEST(ControllerLock, CalmLockedUnitCountsDownEvenWhenSqueezedOutByTheBudget) {
  Controller c(quick_options("gnmr", 1), kLayers);
  auto norms = flat_stream(kUnits, 20, {{10, 5, 10.0f}, {11, 2, 50.0f}});
  for (int step = 0; step <= 11; ++step) c.observe(step, norms[step]);
  // Step 11: unit 2 spiked (selected), unit 5 is calm and locked but out of budget.
  EXPECT_TRUE(is_recovery(c.current_plan(), 2));
  EXPECT_FALSE(is_recovery(c.current_plan(), 5));
  EXPECT_EQ(c.locks()[5], 2);
  EXPECT_EQ(c.locks()[2], 3);
  c.observe(12, norms[12]);
  EXPECT_EQ(c.locks()[5], 1);
  c.observe(13, norms[13]);
  EXPECT_EQ(c.locks()[5], 0);
  for (int step = 14; step < 20; ++step) {
    EXPECT_FALSE(is_recovery(c.observe(step, norms[step]), 5));
  }
}

TEST(ControllerPolicy, TiesGoToTheLowerUnitId) {
  Controller c(quick_options("gnmr", 1), kLayers);
  auto plans = run(c, flat_stream(kUnits, 11, {{10, 9, 10.0f}, {10, 4, 10.0f}}));
  EXPECT_TRUE(is_recovery(plans[10], 4));
  EXPECT_FALSE(is_recovery(plans[10], 9));
  EXPECT_EQ(c.last_telemetry().candidate_units, 2);
}

TEST(ControllerPolicy, TheBudgetGoesToTheRiskiestCandidates) {
  Controller c(quick_options("gnmr", 2), kLayers);
  auto plans = run(c, flat_stream(kUnits, 11, {{10, 1, 3.0f}, {10, 8, 9.0f}, {10, 13, 5.0f}}));
  EXPECT_TRUE(is_recovery(plans[10], 8));
  EXPECT_TRUE(is_recovery(plans[10], 13));
  EXPECT_FALSE(is_recovery(plans[10], 1));
  EXPECT_EQ(c.last_telemetry().candidate_units, 3);
}

// precision.recovery_layers pins layers to recovery outside the budget. The controller once
// spent its budget on their units (already on recovery): with layer 0 pinned and budget 2,
// a spike in layer 0 took the budget from layer 1's risky units.
TEST(ControllerPolicy, PinnedLayersCostNoBudget) {
  for (const char* name : {"gnmr", "topk_norm", "random"}) {
    const std::string kind = name;
    Controller c(quick_options(kind, 2), kLayers, {0});
    // Layer 0 (units 0-6) spikes hardest, layer 1's units 8 and 12 less.
    auto plans =
        run(c, flat_stream(kUnits, 11, {{10, 1, 30}, {10, 2, 20}, {10, 8, 9}, {10, 12, 5}}));
    EXPECT_EQ(plans[10].active_count(), 2) << kind;
    for (int u = 0; u < 7; ++u) EXPECT_FALSE(is_recovery(plans[10], u)) << kind << " " << u;
    if (kind == "gnmr") {
      EXPECT_TRUE(is_recovery(plans[10], 8));
      EXPECT_TRUE(is_recovery(plans[10], 12));
      EXPECT_EQ(c.last_telemetry().candidate_units, 4);  // pinned units are still judged
    }
    // The trace shows the controller's choice, as its summary counts it.
    for (int u = 0; u < 7; ++u) EXPECT_EQ(c.last_telemetry().units[u].path, Path::Low) << u;
  }
  ControllerOptions groups = quick_options("gnmr", 4);
  groups.granularity = "group";
  Controller by_group(groups, kLayers, {-1});  // the last layer: decision units 2 and 3
  EXPECT_EQ(by_group.pinned(), (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_THROW(Controller(quick_options(), kLayers, {2}), std::invalid_argument);
  EXPECT_THROW(Controller(quick_options(), kLayers, {-3}), std::invalid_argument);
}

TEST(ControllerPolicy, PerKindCapLimitsDownProjectionsWhileOtherKindsFill) {
  ControllerOptions o = quick_options("gnmr", 4);
  o.per_kind_cap = {{"down", 1}};
  Controller c(o, 4);
  // Down projections (units 6, 13, 20, 27) spike hardest, q projections (0, 7) less.
  auto norms = flat_stream(
      28, 11, {{10, 6, 20}, {10, 13, 21}, {10, 20, 22}, {10, 27, 23}, {10, 0, 5}, {10, 7, 6}});
  auto plans = run(c, norms);
  EXPECT_EQ(plans[10].active_count(), 3);
  EXPECT_TRUE(is_recovery(plans[10], 27));  // the riskiest down projection
  EXPECT_TRUE(is_recovery(plans[10], 0));
  EXPECT_TRUE(is_recovery(plans[10], 7));
}

TEST(ControllerGroups, MembersShareOnePathAndAGroupIsChosenOnlyIfItFits) {
  ControllerOptions o = quick_options("gnmr", 3);
  o.granularity = "group";
  // Layer 0 attention (units 0-3) spikes harder than layer 1 MLP (units 11-13).
  auto norms = flat_stream(kUnits, 11, {{10, 0, 30}, {10, 1, 30}, {10, 12, 10}});
  Controller three(o, kLayers);
  RoutingPlan plan = run(three, norms)[10];
  EXPECT_EQ(plan.active_count(), 3);  // attention (4 units) does not fit in 3
  for (int u : {11, 12, 13}) EXPECT_TRUE(is_recovery(plan, u));

  o.max_active = 4;
  Controller four(o, kLayers);
  plan = run(four, norms)[10];
  EXPECT_EQ(plan.active_count(), 4);  // attention fits; the MLP group no longer does
  for (int u : {0, 1, 2, 3}) EXPECT_TRUE(is_recovery(plan, u));

  o.max_active = 7;
  Controller seven(o, kLayers);
  EXPECT_EQ(run(seven, norms)[10].active_count(), 7);
  EXPECT_EQ(seven.last_telemetry().units.size(), 4u);
}

TEST(ControllerPolicy, InvalidNormIsMaximallyRiskyButDoesNotPoisonTheHistory) {
  for (float bad : {testing::kNaN, testing::kInf, -testing::kInf}) {
    Controller c(quick_options("gnmr", 1), kLayers);
    RiskMonitor reference(1, 2);
    auto norms = flat_stream(kUnits, 30, {{10, 3, bad}, {10, 5, 1000.0f}});
    for (int step = 0; step < 30; ++step) {
      norms[step][3] = step == 10 ? bad : 1.0f + 0.01f * step;
      RoutingPlan plan = c.observe(step, norms[step]);
      const UnitTrace& unit = c.last_telemetry().units[3];
      if (step == 10) {
        EXPECT_TRUE(is_recovery(plan, 3));  // risk +inf beats the 1000x spike of unit 5
        EXPECT_FALSE(is_recovery(plan, 5));
        EXPECT_EQ(c.last_telemetry().invalid_norms, 1);
        continue;
      }
      // Later scores equal a monitor that never saw the invalid observation.
      UnitScores expected = reference.observe(0, norms[step][3], HistoryMode::Raw, 1.5);
      EXPECT_EQ(std::isnan(unit.gnmr), std::isnan(expected.gnmr));
      if (!std::isnan(expected.gnmr)) {
        EXPECT_EQ(unit.gnmr, expected.gnmr) << step;
      }
      if (!std::isnan(expected.delta)) {
        EXPECT_EQ(unit.delta, expected.delta) << step;
      }
    }
  }
}

TEST(ControllerPolicy, ObserveRejectsStepsThatDoNotIncreaseAndWrongSizes) {
  Controller c(quick_options(), kLayers);
  std::vector<float> norms(kUnits, 1.0f);
  c.observe(5, norms);
  EXPECT_THROW(c.observe(5, norms), std::invalid_argument);
  EXPECT_THROW(c.observe(4, norms), std::invalid_argument);
  EXPECT_THROW(c.observe(6, std::vector<float>(3, 1.0f)), std::invalid_argument);
  EXPECT_THROW(Controller(quick_options(), 0), std::invalid_argument);
  ControllerOptions bad = quick_options();
  bad.window = 0;
  EXPECT_THROW(Controller(bad, kLayers), std::invalid_argument);
}

}  // namespace
}  // namespace gnmr
