// gnmr.history_start: norms before it never enter the RiskMonitor, so GNMR's history begins
// there (controller_options.h), while warm-up and the monitor-free baselines are unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "controller/controller.h"
#include "controller_test_util.h"

namespace gnmr {
namespace {

using testing::flat_stream;
using testing::is_recovery;
using testing::quick_options;
using testing::same_bits;

constexpr int kLayers = 2;
constexpr int kUnits = 7 * kLayers;

// Unit 5 (layer 0, "up") plays the short-run transient: 1.0 at steps 0-1, a 10x collapse to
// 0.1 at steps 2-5, back to 1.0 from step 6, and one real 10x spike at step 20. Every other
// unit stays at 1.0.
std::vector<std::vector<float>> transient_stream(int steps) {
  auto norms = flat_stream(kUnits, steps, {{20, 5, 10.0f}});
  for (int step = 2; step <= 5; ++step) norms[step][5] = 0.1f;
  return norms;
}

TEST(HistoryStart, EarlyTransientBeforeHistoryStartDoesNotMakeALaterUnitExceed) {
  const auto norms = transient_stream(30);

  // The paper's whole history: the collapse drags unit 5's mean down, so the rebound to its
  // old level reads as GNMR 1 / mean(1, 1, 0.1 x4) = 2.5 at step 6 and stays > α = 1.5
  // through step 10 (1 / (6.4 / 10) = 1.5625), then 1 / (7.4 / 11) < 1.5 at step 11.
  Controller whole(quick_options("gnmr", 2), kLayers);
  for (int step = 0; step < 30; ++step) {
    const RoutingPlan plan = whole.observe(step, norms[step]);
    const UnitTrace& unit = whole.last_telemetry().units[5];
    if (step == 6) {
      EXPECT_NEAR(unit.gnmr, 2.5, 1e-6);  // 0.1f is not exactly 0.1
    }
    if (step >= 6 && step <= 10) {
      EXPECT_GT(unit.gnmr, 1.5) << step;
      EXPECT_TRUE(is_recovery(plan, 5)) << step;
    }
  }
  EXPECT_GE(whole.run_telemetry().gnmr_exceedances, 6);  // steps 6-10 and the spike at 20

  // History from step 6: unit 5 has been flat at 1.0 since, so only the real spike counts.
  ControllerOptions o = quick_options("gnmr", 2);
  o.history_start = 6;
  Controller late(o, kLayers);
  for (int step = 0; step < 30; ++step) {
    const RoutingPlan plan = late.observe(step, norms[step]);
    const StepTelemetry& t = late.last_telemetry();
    // Δ-GNMR needs δ + 2 = 4 recorded norms: steps 6, 7, 8, 9.
    EXPECT_EQ(t.eligible_units, step >= 9 ? kUnits : 0) << step;
    EXPECT_EQ(t.exceeding_units, step == 20 ? 1 : 0) << step;
    EXPECT_EQ(is_recovery(plan, 5), step >= 20 && step <= 20 + o.lock_steps) << step;
    if (step >= 7 && step != 20) {
      EXPECT_LE(t.units[5].gnmr, 1.0) << step;
    }
  }
  EXPECT_EQ(late.run_telemetry().exceeding_unit_steps, 1);
  EXPECT_EQ(late.run_telemetry().eligible_unit_steps, 21 * kUnits);
}

TEST(HistoryStart, ScoresFromHistoryStartOnEqualAFreshMonitorFedOnlyFromThere) {
  constexpr int kStart = 10;
  for (const std::string granularity : {"projection", "group"}) {
    SCOPED_TRACE(granularity);
    ControllerOptions o = quick_options("gnmr", 3);  // 3: an MLP group fits
    o.history_start = kStart;
    o.window = 3;
    o.granularity = granularity;
    o.history = "capped";  // the monitor then depends on α_t too, which a schedule moves
    o.threshold_schedule = "linear";
    o.schedule_steps = 40;
    o.alpha_final = 1.2;
    auto norms = testing::noisy_stream(kUnits, 60, 11);
    norms[3][2] = testing::kNaN;  // before history_start: ignored
    for (int u = 0; u < kUnits; ++u) norms[15][u] = 1.0f;
    norms[15][4] = testing::kInf;  // after it: maximally risky as always
    Controller c(o, kLayers);
    RiskMonitor reference(c.decision_units().n_decision_units(), o.window);
    const HistoryMode history = parse_history_mode(o.history);
    int64_t invalid_from_start = 0;  // invalid decision norms at steps >= history_start
    for (int step = 0; step < 60; ++step) {
      const RoutingPlan plan = c.observe(step, norms[step]);
      const StepTelemetry& t = c.last_telemetry();
      if (step < kStart) {
        // Not observed: undefined scores, nobody judged, nothing counted or recovered,
        // although decisions are on (warmup_steps = 0) and invalid norms occur.
        EXPECT_EQ(t.eligible_units, 0) << step;
        EXPECT_EQ(t.invalid_norms, 0) << step;
        EXPECT_EQ(t.candidate_units, 0) << step;
        EXPECT_EQ(plan.active_count(), 0) << step;
        for (const UnitTrace& unit : t.units) {
          EXPECT_TRUE(std::isnan(unit.gnmr) && std::isnan(unit.delta)) << step;
        }
        if (step == 3) {
          EXPECT_TRUE(std::isnan(t.units[granularity == "group" ? 0 : 2].norm));
        }
        continue;
      }
      const double alpha_t = thresholds_at(o, step).alpha;
      for (int d = 0; d < c.decision_units().n_decision_units(); ++d) {
        const UnitScores expected = reference.observe(d, t.units[d].norm, history, alpha_t);
        invalid_from_start += !expected.norm_valid;
        EXPECT_TRUE(same_bits(t.units[d].gnmr, expected.gnmr)) << step << " unit " << d;
        EXPECT_TRUE(same_bits(t.units[d].delta, expected.delta)) << step << " unit " << d;
      }
      if (step == 15) {
        EXPECT_EQ(t.invalid_norms, 1);
        EXPECT_TRUE(is_recovery(plan, 4));
      }
    }
    // Invalid norms count from history_start on only (warmup_steps = 0 judges them all).
    EXPECT_GE(invalid_from_start, 1);
    EXPECT_EQ(c.run_telemetry().invalid_norms, invalid_from_start);
  }
}

TEST(HistoryStart, WarmupAndMonitorFreeBaselinePlansAreUnchanged) {
  const auto norms = testing::noisy_stream(kUnits, 40, 4);
  for (const std::string controller : {"random", "topk_norm", "static_low", "static_high"}) {
    SCOPED_TRACE(controller);
    ControllerOptions o = quick_options(controller, 3);
    o.warmup_steps = 5;
    Controller today(o, kLayers);
    o.history_start = 25;
    Controller later(o, kLayers);
    for (int step = 0; step < 40; ++step) {
      ASSERT_EQ(later.observe(step, norms[step]), today.observe(step, norms[step])) << step;
    }
  }
  // GNMR kinds: still all Low before warmup_steps, even with the history already running.
  ControllerOptions o = quick_options("gnmr", 3);
  o.warmup_steps = 20;
  o.history_start = 2;
  Controller c(o, kLayers);
  const auto spiky = flat_stream(kUnits, 21, {{19, 5, 10.0f}, {20, 6, 10.0f}});
  for (int step = 0; step < 21; ++step) {
    const RoutingPlan plan = c.observe(step, spiky[step]);
    EXPECT_EQ(plan.active_count(), step < 20 ? 0 : 1) << step;
  }
  EXPECT_TRUE(is_recovery(c.current_plan(), 6));
}

// Controller::first_selecting_step (what the trainer's warning of a run too short for its
// controller reads) is the first step at which observe() selects a unit: norms fed from step
// 1, as the trainer does, every unit a candidate once it has both scores (α = β tiny).
TEST(HistoryStart, FirstSelectingStepIsTheFirstStepThatSelects) {
  const auto norms = testing::noisy_stream(kUnits, 80, 7);
  for (const std::string kind :
       {"gnmr", "gnmr_no_delta", "gnmr_no_lock", "random", "topk_norm", "oracle"}) {
    for (const int history_start : {0, 1, 9}) {
      for (const int warmup : {0, 5, 30}) {
        ControllerOptions o = quick_options(kind, 2);
        o.alpha = o.beta = 1e-9;
        o.window = 4;
        o.history_start = history_start;
        o.warmup_steps = warmup;
        Controller c(o, kLayers);
        int64_t first = -1;
        for (int step = 1; step < 80 && first < 0; ++step) {
          std::vector<float> finite = norms[step];
          for (float& n : finite) n = std::isfinite(n) ? n : 1.0f;  // no NaN-made candidate
          if (kind == "oracle") c.set_recovery_gaps(finite);  // any gaps: it takes the largest
          const RoutingPlan plan = c.observe(step, finite);
          for (int u = 0; u < kUnits; ++u) {
            if (is_recovery(plan, u)) first = step;
          }
        }
        EXPECT_EQ(first, c.first_selecting_step())
            << kind << " history_start " << history_start << " warmup " << warmup;
      }
    }
  }
  Controller never(quick_options("static_low"), kLayers);
  EXPECT_EQ(never.first_selecting_step(), INT64_MAX);
}

}  // namespace
}  // namespace gnmr
