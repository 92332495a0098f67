// The baselines and ablations under the same interface and budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "controller/baselines.h"
#include "controller/controller.h"
#include "controller_test_util.h"

namespace gnmr {
namespace {

using testing::is_recovery;
using testing::quick_options;

constexpr int kLayers = 2;
constexpr int kUnits = 14;

TEST(Baselines, StaticLowIsAlwaysLowAndStaticHighAlwaysRecoveryRegardlessOfBudget) {
  const auto stream = testing::noisy_stream(kUnits, 40, 3);
  Controller low(quick_options("static_low", 3), kLayers);
  Controller high(quick_options("static_high", 3), kLayers);
  EXPECT_EQ(low.initial_plan().active_count(), 0);
  EXPECT_EQ(high.initial_plan().active_count(), kUnits);
  for (int step = 0; step < 40; ++step) {
    EXPECT_EQ(low.observe(step, stream[step]).active_count(), 0);
    EXPECT_EQ(high.observe(step, stream[step]).active_count(), kUnits);
  }
  EXPECT_EQ(high.run_telemetry().switches, 0);
  EXPECT_EQ(high.run_telemetry().active_fraction(), 1.0);
  // Both still monitor, so their exceedance telemetry is comparable with GNMR's.
  EXPECT_GT(low.run_telemetry().eligible_unit_steps, 0);
}

TEST(Baselines, RandomOrderIsAPermutationThatDependsOnlyOnSeedAndStep) {
  std::vector<int> a, b, c;
  random_order(7, 100, 50, a);
  random_order(7, 100, 50, b);
  random_order(8, 100, 50, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> expected(50);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(sorted, expected);
}

TEST(Baselines, RandomPicksExactlyBudgetUnitsPerStepAfterWarmupReproducibly) {
  ControllerOptions o = quick_options("random", 3);
  o.warmup_steps = 5;
  o.seed = 11;
  Controller first(o, kLayers), second(o, kLayers);
  o.seed = 12;
  Controller other_seed(o, kLayers);
  const std::vector<float> norms(kUnits, 1.0f);
  std::vector<int64_t> picked(kUnits, 0);
  bool seeds_differ = false;
  const int steps = 3000;
  for (int step = 0; step < steps; ++step) {
    const RoutingPlan plan = first.observe(step, norms);
    EXPECT_EQ(plan, second.observe(step, norms));
    seeds_differ |= plan != other_seed.observe(step, norms);
    EXPECT_EQ(plan.active_count(), step < 5 ? 0 : 3);
    for (int u = 0; u < kUnits; ++u) picked[u] += is_recovery(plan, u);
  }
  EXPECT_TRUE(seeds_differ);
  // Uniform: each unit is expected (steps - 5) * 3 / 14 ≈ 642 times; ±25% is > 9 sigma.
  for (int u = 0; u < kUnits; ++u) {
    EXPECT_NEAR(picked[u], (steps - 5) * 3.0 / kUnits, 0.25 * (steps - 5) * 3.0 / kUnits) << u;
  }
}

TEST(Baselines, TopkNormPicksTheLargestRawNormsWithInvalidFirst) {
  ControllerOptions o = quick_options("topk_norm", 3);
  o.warmup_steps = 1;
  Controller c(o, kLayers);
  std::vector<float> norms(kUnits);
  for (int u = 0; u < kUnits; ++u) norms[u] = static_cast<float>(u % 5);  // 4 at units 4, 9
  EXPECT_EQ(c.observe(0, norms).active_count(), 0);                       // warm-up
  RoutingPlan plan = c.observe(1, norms);
  EXPECT_EQ(plan.active_count(), 3);
  EXPECT_TRUE(is_recovery(plan, 4));
  EXPECT_TRUE(is_recovery(plan, 9));
  EXPECT_TRUE(is_recovery(plan, 3));  // the 3s at units 3, 8, 13: lowest id wins
  norms[12] = testing::kNaN;
  plan = c.observe(2, norms);
  EXPECT_TRUE(is_recovery(plan, 12));
  EXPECT_TRUE(is_recovery(plan, 4));
  EXPECT_TRUE(is_recovery(plan, 9));
}

TEST(Baselines, GnmrNoDeltaIgnoresASpikeOnlyDeltaGnmrSees) {
  // Norm 10 for 30 steps, then 1 for 10 steps: the long mean stays high, the recent GNMR
  // values are ~0.13. A norm of 3 is then GNMR ≈ 0.39 < α but Δ-GNMR ≈ 2.9 > β.
  std::vector<std::vector<float>> norms(41, std::vector<float>(kUnits, 10.0f));
  for (int step = 30; step < 41; ++step) norms[step][5] = 1.0f;
  norms[40][5] = 3.0f;
  ControllerOptions o = quick_options("gnmr", 2);
  o.window = 4;
  Controller with_delta(o, kLayers);
  o.controller = "gnmr_no_delta";
  Controller without_delta(o, kLayers);
  for (int step = 0; step < 41; ++step) {
    with_delta.observe(step, norms[step]);
    without_delta.observe(step, norms[step]);
  }
  const UnitTrace& unit = with_delta.last_telemetry().units[5];
  EXPECT_LT(unit.gnmr, 1.5);
  EXPECT_GT(unit.delta, 1.5);
  EXPECT_TRUE(is_recovery(with_delta.current_plan(), 5));
  EXPECT_FALSE(is_recovery(without_delta.current_plan(), 5));
  EXPECT_EQ(without_delta.last_telemetry().delta_exceedances, 0);
}

TEST(Baselines, GnmrNoLockReleasesAUnitAsSoonAsItIsCalm) {
  Controller c(quick_options("gnmr_no_lock", 2), kLayers);
  const auto norms = testing::flat_stream(kUnits, 15, {{10, 5, 10.0f}});
  for (int step = 0; step < 15; ++step) {
    EXPECT_EQ(is_recovery(c.observe(step, norms[step]), 5), step == 10) << step;
    EXPECT_EQ(c.locks()[5], 0);
  }
}

TEST(Baselines, OracleRecoversTheLargestGapsUnderTheBudgetAndNeedsThem) {
  ControllerOptions o = quick_options("oracle", 3);
  o.warmup_steps = 1;
  Controller c(o, kLayers);
  EXPECT_TRUE(c.needs_recovery_gaps());
  EXPECT_FALSE(Controller(quick_options("gnmr", 3), kLayers).needs_recovery_gaps());
  const std::vector<float> norms(kUnits, 1.0f);
  // Before warm-up the oracle decides nothing and needs no gaps.
  EXPECT_EQ(c.observe(0, norms).active_count(), 0);
  // No gaps past warm-up is a caller's bug, not a silent all-low plan.
  EXPECT_THROW(c.observe(1, norms), std::logic_error);
  std::vector<float> gaps(kUnits);
  for (int u = 0; u < kUnits; ++u) gaps[u] = 0.01f * static_cast<float>(u % 5);  // 0.04: 4, 9
  c.set_recovery_gaps(gaps);
  const RoutingPlan same_step = c.oracle_plan(2);
  RoutingPlan plan = c.observe(2, norms);
  EXPECT_EQ(plan, same_step);  // the same choice, whether applied now or one step later
  EXPECT_EQ(plan.active_count(), 3);
  EXPECT_TRUE(is_recovery(plan, 4));
  EXPECT_TRUE(is_recovery(plan, 9));
  EXPECT_TRUE(is_recovery(plan, 3));  // the 0.03s at units 3, 8, 13: lowest id wins
  // observe consumed the gaps: the next step needs new ones.
  EXPECT_THROW(c.observe(3, norms), std::logic_error);
  gaps[12] = testing::kNaN;  // a non-finite gap (zero recovery gradient) ranks first
  c.set_recovery_gaps(gaps);
  plan = c.observe(4, norms);
  EXPECT_TRUE(is_recovery(plan, 12));
  EXPECT_EQ(plan.active_count(), 3);
  EXPECT_THROW(c.set_recovery_gaps(std::vector<float>(3, 0.0f)), std::invalid_argument);
  // Before warm-up the choice is all Low whatever the gaps.
  c.set_recovery_gaps(gaps);
  EXPECT_EQ(c.oracle_plan(0).active_count(), 0);
}

TEST(Baselines, OracleChoiceRespectsGroupsAndPerKindCaps) {
  ControllerOptions o = quick_options("oracle", 4);
  o.warmup_steps = 0;
  o.granularity = "group";
  Controller groups(o, kLayers);
  std::vector<float> gaps(kUnits, 0.0f);
  gaps[12] = 0.5f;  // layer 1, MLP group (gate, up, down = units 11..13): 3 units
  gaps[0] = 0.4f;   // layer 0, attention group (q, k, v, o): 4 units, over what is left
  gaps[5] = 0.1f;   // layer 0, MLP group: 3 units, over the 1 left too
  groups.set_recovery_gaps(gaps);
  RoutingPlan plan = groups.oracle_plan(0);
  EXPECT_EQ(plan.active_count(), 3);
  for (int u = 11; u < 14; ++u) EXPECT_TRUE(is_recovery(plan, u)) << u;

  o = quick_options("oracle", 3);
  o.warmup_steps = 0;
  o.per_kind_cap = {{"q", 1}};
  Controller capped(o, kLayers);
  std::fill(gaps.begin(), gaps.end(), 0.0f);
  gaps[0] = 0.9f;  // layer 0 q
  gaps[7] = 0.8f;  // layer 1 q: over the cap
  gaps[2] = 0.1f;
  gaps[3] = 0.05f;
  capped.set_recovery_gaps(gaps);
  plan = capped.oracle_plan(0);
  EXPECT_TRUE(is_recovery(plan, 0));
  EXPECT_FALSE(is_recovery(plan, 7));
  EXPECT_TRUE(is_recovery(plan, 2));
  EXPECT_TRUE(is_recovery(plan, 3));
}

}  // namespace
}  // namespace gnmr
