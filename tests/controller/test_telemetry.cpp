// Step and run telemetry on a hand-built stream, and the compact trace line.
#include <gtest/gtest.h>

#include <sstream>

#include "controller/controller.h"
#include "controller_test_util.h"

namespace gnmr {
namespace {

constexpr int kUnits = 14;

TEST(ControllerTelemetry, CountsExceedancesActiveFractionAndSwitches) {
  // δ = 2: units are eligible from step 3; unit 5 (layer 0, "up") spikes x5 at step 5.
  Controller c(testing::quick_options("gnmr_no_lock", 1), 2);
  const auto norms = testing::flat_stream(kUnits, 10, {{5, 5, 5.0f}});
  for (int step = 0; step < 10; ++step) {
    c.observe(step, norms[step]);
    const StepTelemetry& t = c.last_telemetry();
    EXPECT_EQ(t.step, step);
    EXPECT_EQ(t.eligible_units, step >= 3 ? kUnits : 0);
    EXPECT_EQ(t.exceeding_units, step == 5 ? 1 : 0);
    EXPECT_EQ(t.gnmr_exceedances, step == 5 ? 1 : 0);   // GNMR 5 / mean(1..1) = 5
    EXPECT_EQ(t.delta_exceedances, step == 5 ? 1 : 0);  // Δ 5 / mean(1, 1) = 5
    EXPECT_EQ(t.candidate_units, step == 5 ? 1 : 0);
    EXPECT_EQ(t.active_units, step == 5 ? 1 : 0);
    EXPECT_EQ(t.switches, step == 5 || step == 6 ? 1 : 0);
  }
  const RunTelemetry& run = c.run_telemetry();
  EXPECT_EQ(run.steps, 10);
  EXPECT_EQ(run.eligible_unit_steps, 7 * kUnits);
  EXPECT_EQ(run.exceeding_unit_steps, 1);
  EXPECT_DOUBLE_EQ(run.exceedance_rate(), 1.0 / (7 * kUnits));
  EXPECT_DOUBLE_EQ(run.active_fraction(), 1.0 / (10 * kUnits));
  EXPECT_DOUBLE_EQ(run.switches_per_1000_steps(), 200.0);
  const nlohmann::json summary = c.summary();
  EXPECT_EQ(summary["controller"], "gnmr_no_lock");
  EXPECT_EQ(summary["budget"], 1);
  EXPECT_EQ(summary["kinds"][5], "up");
  EXPECT_EQ(summary["recovered_steps"].size(), 2u);
  EXPECT_EQ(summary["recovered_steps"][0][5], 1);  // layer 0, up
  EXPECT_EQ(summary["recovered_steps"][1][5], 0);
  EXPECT_EQ(summary["switches"], 2);
}

TEST(ControllerTelemetry, TraceLineIsCompactJsonWithNullForUndefinedScores) {
  Controller c(testing::quick_options("gnmr", 2), 2);
  auto norms = testing::flat_stream(kUnits, 6, {{5, 3, 10.0f}, {5, 0, testing::kNaN}});
  for (int step = 0; step < 6; ++step) c.observe(step, norms[step]);
  std::ostringstream out;
  c.write_trace_line(out);
  const std::string line = out.str();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json trace = nlohmann::json::parse(line);
  EXPECT_EQ(trace["kind"], "gnmr_trace");
  EXPECT_EQ(trace["step"], 5);
  EXPECT_EQ(trace["granularity"], "projection");
  EXPECT_EQ(trace["norm"].size(), static_cast<size_t>(kUnits));
  EXPECT_TRUE(trace["norm"][0].is_null());
  EXPECT_TRUE(trace["gnmr"][0].is_null());
  EXPECT_EQ(trace["gnmr"][3], 10);
  EXPECT_EQ(trace["gnmr"][4], 1);
  EXPECT_EQ(trace["path"][0], 1);  // invalid norm: risk +inf
  EXPECT_EQ(trace["path"][3], 1);
  EXPECT_EQ(trace["path"][4], 0);
  EXPECT_EQ(trace["lock"][3], 3);
  EXPECT_EQ(trace["risk"].size(), static_cast<size_t>(kUnits));
  EXPECT_TRUE(trace["risk"][0].is_null());  // invalid norm: +inf
  EXPECT_FALSE(trace.contains("gap"));      // not measured
}

TEST(ControllerTelemetry, TraceCarriesTheGapsOfTheStepTheyWereSetFor) {
  Controller c(testing::quick_options("gnmr", 2), 2);
  const std::vector<float> norms(kUnits, 1.0f);
  std::vector<float> gaps(kUnits, 0.25f);
  gaps[6] = testing::kInf;
  c.set_recovery_gaps(gaps);
  c.observe(0, norms);
  std::ostringstream out;
  c.write_trace_line(out);
  const nlohmann::json trace = nlohmann::json::parse(out.str());
  ASSERT_EQ(trace["gap"].size(), static_cast<size_t>(kUnits));
  EXPECT_EQ(trace["gap"][0], 0.25);
  EXPECT_TRUE(trace["gap"][6].is_null());
  c.observe(1, norms);  // no gaps set for this step
  std::ostringstream next;
  c.write_trace_line(next);
  EXPECT_FALSE(nlohmann::json::parse(next.str()).contains("gap"));
}

TEST(ControllerTelemetry, MetricsFieldsCarryTheStepCounts) {
  Controller c(testing::quick_options("gnmr", 2), 2);
  auto norms = testing::flat_stream(kUnits, 6, {{5, 3, 10.0f}});
  for (int step = 0; step < 6; ++step) c.observe(step, norms[step]);
  const nlohmann::json fields = c.last_telemetry().metrics_fields();
  EXPECT_EQ(fields["active_units"], 1);
  EXPECT_EQ(fields["candidate_units"], 1);
  EXPECT_EQ(fields["gnmr_exceedances"], 1);
  EXPECT_EQ(fields["switches"], 1);
}

}  // namespace
}  // namespace gnmr
