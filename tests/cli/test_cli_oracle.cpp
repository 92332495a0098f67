// The recovery-gap measurement (log.recovery_gap) and the oracle controller end to end: the
// measurement must not change the run it measures, the oracle must recover exactly the units
// with the largest measured gaps (one step later, or on the same step), and it must resume
// bit-exactly like every controller.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using gnmr_test::run_gnmr;

namespace {

// The fp4 stress (fp4 e2m1 low, fp8 e4m3 recovery), where the two paths differ.
std::string stress_config(const std::string& dir, const std::string& gnmr_json, bool recovery_gap) {
  return gnmr_test::write_tiny_config(
      dir, R"({"precision": {"recipe": "fp8mix", "low_format": "e2m1", "recovery_format": "e4m3"},
               "gnmr": )" +
               gnmr_json + R"(, "log": {"gnmr_trace": true, "recovery_gap": )" +
               (recovery_gap ? "true" : "false") + "}}");
}

std::vector<nlohmann::json> read_trace(const std::string& run) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(run + "/gnmr_trace.jsonl");
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The units the oracle must pick from one trace line: the `budget` largest gaps, ties by id.
std::vector<int> largest_gaps(const nlohmann::json& trace, int budget) {
  const auto& gap = trace["gap"];
  std::vector<int> order(gap.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return gap[size_t(a)].get<double>() > gap[size_t(b)].get<double>();
  });
  order.resize(size_t(budget));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int> recovered(const nlohmann::json& trace) {
  std::vector<int> units;
  for (size_t u = 0; u < trace["path"].size(); ++u) {
    if (trace["path"][u] == 1) units.push_back(int(u));
  }
  return units;
}

// step -> units_recovery of the train lines of a metrics file.
std::map<int64_t, int> units_recovery_by_step(const std::string& run) {
  std::map<int64_t, int> by_step;
  for (const auto& line : gnmr_test::read_metrics(run + "/metrics.jsonl")) {
    if (line["kind"] == "train") by_step[line["step"].get<int64_t>()] = line["units_recovery"];
  }
  return by_step;
}

}  // namespace

TEST(CliOracle, MeasuringTheRecoveryGapLeavesTheRunBitIdenticalAndTracesEveryUnitsGap) {
  std::string dir = gnmr_test::scratch_dir("cli_recovery_gap");
  // Touchy thresholds and a short window, so that GNMR routes units within 12 steps.
  const std::string gnmr = R"({"controller": "gnmr", "max_active": 2, "warmup_steps": 2,
                               "window": 2, "alpha": 1.01, "beta": 1.01, "lock_steps": 2})";
  fs::create_directories(dir + "/plain");
  fs::create_directories(dir + "/measured");
  auto plain = run_gnmr("train --config " + stress_config(dir + "/plain", gnmr, false) + " --out " +
                        dir + "/plain/run");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto measured = run_gnmr("train --config " + stress_config(dir + "/measured", gnmr, true) +
                           " --out " + dir + "/measured/run");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("recovery gap: every step also runs its batches"),
            std::string::npos)
      << measured.output;

  // Same losses, same routing, same weights: the extra passes leave nothing behind. Only the
  // backend's bytes grow, by the measurement's loss scalar.
  auto a = gnmr_test::read_metrics(dir + "/plain/run/metrics.jsonl");
  auto b = gnmr_test::read_metrics(dir + "/measured/run/metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  int recovered_unit_steps = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i]["kind"] == "train") {
      recovered_unit_steps += a[i]["units_recovery"].get<int>();
      EXPECT_LE(b[i]["backend_bytes"].get<int64_t>() - a[i]["backend_bytes"].get<int64_t>(), 64);
    }
    a[i].erase("backend_bytes");
    b[i].erase("backend_bytes");
    EXPECT_EQ(gnmr_test::without_timing(a[i]), gnmr_test::without_timing(b[i])) << "line " << i;
  }
  EXPECT_GT(recovered_unit_steps, 0) << "GNMR routed nothing: the test shows less than it claims";
  EXPECT_EQ(
      gnmr_test::read_bytes(dir + "/plain/run/checkpoints/step_00000012/model.safetensors"),
      gnmr_test::read_bytes(dir + "/measured/run/checkpoints/step_00000012/model.safetensors"));

  const auto plain_trace = read_trace(dir + "/plain/run");
  const auto trace = read_trace(dir + "/measured/run");
  ASSERT_EQ(trace.size(), 12u);
  for (const auto& line : plain_trace) {
    EXPECT_FALSE(line.contains("gap"));
    EXPECT_EQ(line["risk"].size(), 14u);
  }
  double largest = 0;
  for (const auto& line : trace) {
    ASSERT_EQ(line["gap"].size(), 14u) << line.dump();
    for (const auto& gap : line["gap"]) {
      ASSERT_TRUE(gap.is_number()) << line.dump();
      EXPECT_GE(gap.get<double>(), 0.0);
      largest = std::max(largest, gap.get<double>());
    }
  }
  // fp4 against fp8 operands: every weight gradient is off by several percent at least.
  EXPECT_GT(largest, 0.01);
}

TEST(CliOracle, RecoversTheLargestGapsOneStepLaterOrOnTheSameStep) {
  std::string dir = gnmr_test::scratch_dir("cli_oracle");
  const int budget = 3;
  for (bool same_step : {false, true}) {
    SCOPED_TRACE(same_step ? "oracle_same_step" : "one-step lag");
    const std::string name = same_step ? "same" : "lag";
    fs::create_directories(dir + "/" + name);
    const std::string gnmr = R"({"controller": "oracle", "max_active": 3, "warmup_steps": 2,
                                 "oracle_same_step": )" +
                             std::string(same_step ? "true" : "false") + "}";
    const std::string run = dir + "/" + name + "/run";
    // log.recovery_gap stays false: the oracle measures the gaps by itself.
    auto r = run_gnmr("train --config " + stress_config(dir + "/" + name, gnmr, false) + " --out " +
                      run);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto trace = read_trace(run);
    const auto units_recovery = units_recovery_by_step(run);
    ASSERT_EQ(trace.size(), 12u);
    for (const auto& line : trace) {
      const int64_t step = line["step"];
      ASSERT_TRUE(line.contains("gap")) << line.dump();
      const std::vector<int> expected = step >= 2 ? largest_gaps(line, budget) : std::vector<int>{};
      // The trace's path is the plan this observation returned: for step + 1 with the lag,
      // the one step itself ran with on the same step.
      EXPECT_EQ(recovered(line), expected) << "step " << step;
      const int64_t ran_on = same_step ? step : step + 1;
      if (units_recovery.count(ran_on)) {
        EXPECT_EQ(units_recovery.at(ran_on), int(expected.size())) << "step " << ran_on;
      }
    }
    EXPECT_EQ(units_recovery.at(1), 0);  // before any decision
  }
}

TEST(CliOracle, ResumeAfterAStopIsBitExact) {
  std::string dir = gnmr_test::scratch_dir("cli_oracle_resume");
  std::string config =
      stress_config(dir, R"({"controller": "oracle", "max_active": 2, "warmup_steps": 2})", false);
  auto whole = run_gnmr("train --config " + config + " --out " + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto first = run_gnmr("train --config " + config + " --out " + dir + "/split --stop-at 6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run_gnmr("train --config " + config + " --out " + dir + "/split --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "controller.bin"}) {
    EXPECT_EQ(gnmr_test::read_bytes(dir + "/whole/checkpoints/step_00000012/" + file),
              gnmr_test::read_bytes(dir + "/split/checkpoints/step_00000012/" + file))
        << file;
  }
}

TEST(CliOracle, MoreThanOneRankIsRefusedBeforeTraining) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  std::string dir = gnmr_test::scratch_dir("cli_oracle_mpi");
  std::string config = stress_config(dir, R"({"controller": "oracle", "max_active": 2})", false);
  auto r = gnmr_test::run_gnmr_mpi(
      GNMR_MPIEXEC, 2, "train --config " + config + " --out " + dir + "/run", "timeout 120");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("run on one rank"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints"));
}
