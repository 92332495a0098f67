// `gnmr bench` reports the backend's memory by role, its MFU against the better of two peaks,
// and the controller's share of the step.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "config/config.h"
#include "model/param_table.h"
#include "train/zero_shards.h"

using gnmr_test::last_json_line;
using gnmr_test::run_gnmr;

namespace {

// One measured step of the tiny model on one thread: the output and its JSON figures.
struct BenchRun {
  std::string config, output;
  nlohmann::json figures;
};
BenchRun bench_tiny_model(const std::string& name, const std::string& extra_json = "{}") {
  BenchRun b;
  b.config = gnmr_test::write_tiny_config(gnmr_test::scratch_dir(name), extra_json);
  auto r = run_gnmr("bench --config " + b.config + " --steps 1 --warmup 0 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  b.output = r.output;
  b.figures = last_json_line(r.output);
  return b;
}

}  // namespace

TEST(CliBench, PrintsTheBackendMemoryByRoleSummingToTheTotal) {
  const BenchRun b = bench_tiny_model("cli_bench_memory");
  const std::string& config = b.config;
  const nlohmann::json& figures = b.figures;
  ASSERT_TRUE(figures.contains("backend_bytes_by_role")) << b.output;
  const nlohmann::json& by_role = figures["backend_bytes_by_role"];
  size_t sum = 0;
  for (const char* role :
       {"weights", "gradients", "optimizer_state", "activations", "saved_activations", "scratch"}) {
    ASSERT_TRUE(by_role.contains(role)) << role << ": " << by_role.dump();
    EXPECT_GT(by_role[role].get<size_t>(), 0u) << role;
    EXPECT_NE(b.output.find(std::string("    ") + role + " "), std::string::npos) << role;
    sum += by_role[role].get<size_t>();
  }
  EXPECT_EQ(by_role.size(), 6u) << by_role.dump();
  EXPECT_EQ(sum, figures["backend_bytes"].get<size_t>());
  // Nothing is freed during a run, so the peak is the total.
  EXPECT_EQ(figures["backend_peak_bytes"].get<size_t>(), sum);
  // The weights are one fp32 buffer of every parameter, padding included; the gradients match.
  const gnmr::ParamTable table = gnmr::build_param_table(gnmr::load_run_config(config, {}).model);
  EXPECT_EQ(by_role["weights"].get<size_t>(), size_t(4 * table.flat_size));
  EXPECT_EQ(by_role["gradients"].get<size_t>(), size_t(4 * table.flat_size));
  EXPECT_NE(b.output.find("backend memory"), std::string::npos) << b.output;
  // Plain data parallelism: two fp32 moments of every parameter on every rank.
  int64_t params = 0;
  for (const gnmr::ParamInfo& p : table.params) params += gnmr::param_numel(p);
  EXPECT_EQ(figures["optimizer_state_bytes_per_rank"].get<int64_t>(), 8 * params);
  EXPECT_EQ(figures["parameters"].get<int64_t>(), params);
  EXPECT_NE(b.output.find("  parameters "), std::string::npos) << b.output;
  EXPECT_EQ(figures["dist_zero"].get<int>(), 0);
  EXPECT_NE(b.output.find("optimizer state"), std::string::npos) << b.output;
}

// The GEMM peak is measured before and after the steps and the better one is the MFU's
// denominator, so one measurement taken in a slow moment cannot inflate the MFU.
TEST(CliBench, MfuIsAgainstTheBetterOfThePeaksMeasuredBeforeAndAfterTheSteps) {
  const BenchRun b = bench_tiny_model("cli_bench_peak");
  const nlohmann::json& figures = b.figures;
  ASSERT_TRUE(figures.contains("gemm_peak_before_gflops")) << b.output;
  ASSERT_TRUE(figures.contains("gemm_peak_after_gflops")) << b.output;
  const double before = figures["gemm_peak_before_gflops"].get<double>();
  const double after = figures["gemm_peak_after_gflops"].get<double>();
  EXPECT_GT(before, 0.0);
  EXPECT_GT(after, 0.0);
  EXPECT_EQ(figures["gemm_peak_gflops"].get<double>(), std::max(before, after));
  EXPECT_DOUBLE_EQ(figures["mfu"].get<double>(),
                   figures["achieved_gflops"].get<double>() / std::max(before, after));
}

// The controller's share of the step counts the norm pass as timed alone with the backend
// synchronized (its device time on a GPU), not the step's time to issue it.
TEST(CliBench, ControllerShareCountsTheNormPassTimedAlone) {
  const BenchRun b = bench_tiny_model("cli_bench_norm_pass");
  const nlohmann::json& figures = b.figures;
  ASSERT_TRUE(figures.contains("norm_pass_ms")) << b.output;
  const double norm_pass_ms = figures["norm_pass_ms"].get<double>();
  EXPECT_GT(norm_pass_ms, 0.0);
  EXPECT_LT(norm_pass_ms, figures["step_ms"].get<double>());
  EXPECT_DOUBLE_EQ(
      figures["controller_and_norms_fraction"].get<double>(),
      (norm_pass_ms + figures["controller_ms"].get<double>()) / figures["step_ms"].get<double>());
  EXPECT_NE(b.output.find("norm pass "), std::string::npos) << b.output;
  EXPECT_EQ(figures["recovery_gap_ms"], 0.0);
}

// The oracle's two extra forward+backward passes a step are its controller's cost: they were
// in no field (the parts summed to a third of step_ms) and the share said 0.04%.
TEST(CliBench, TheOraclesGapPassesAreItsControllersCost) {
  const BenchRun b = bench_tiny_model("cli_bench_oracle", R"({"gnmr": {"controller": "oracle"}})");
  const nlohmann::json& f = b.figures;
  const double gap_ms = f["recovery_gap_ms"].get<double>();
  const double step_ms = f["step_ms"].get<double>();
  EXPECT_GT(gap_ms, f["forward_backward_ms"].get<double>()) << b.output;  // two passes to one
  EXPECT_LT(gap_ms, step_ms);
  EXPECT_DOUBLE_EQ(
      f["controller_and_norms_fraction"].get<double>(),
      (f["norm_pass_ms"].get<double>() + f["controller_ms"].get<double>() + gap_ms) / step_ms);
  EXPECT_NE(b.output.find("recovery gap passes "), std::string::npos) << b.output;
}

// The report names the attention kernels the layers run (on the cpu its materialized one).
TEST(CliBench, NamesTheAttentionKernel) {
  const BenchRun b = bench_tiny_model("cli_bench_attention");
  ASSERT_TRUE(b.figures.contains("attention")) << b.output;
  EXPECT_EQ(b.figures["attention"].get<std::string>(), "materialized (cpu)");
  EXPECT_NE(b.output.find("  attention       materialized (cpu)\n"), std::string::npos) << b.output;
}

// bench runs its own --steps, not train.steps: the start-up warnings about a run too short for
// its learning-rate warm-up or for the controller to select a unit are the trainer's, not its.
TEST(CliBench, SaysNothingAboutTrainSteps) {
  const BenchRun b =
      bench_tiny_model("cli_bench_train_steps", R"({"train": {"steps": 3, "warmup_steps": 5},
          "precision": {"recipe": "actq"}, "gnmr": {"controller": "gnmr", "warmup_steps": 20}})");
  EXPECT_EQ(b.output.find("train.steps"), std::string::npos) << b.output;
  // The trainer's --check on the same config says both.
  const std::string run_dir = std::filesystem::path(b.config).parent_path().string() + "/run";
  auto r = run_gnmr("train --check --config " + b.config + " --out " + run_dir);
  EXPECT_NE(r.output.find("train.warmup_steps 5 is not below train.steps 3"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("in train.steps 3 it will recover nothing"), std::string::npos)
      << r.output;
}
