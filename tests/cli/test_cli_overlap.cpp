// Two MPI ranks training with the overlapped, bucketed gradient sum (dist.bucket_mb > 0)
// against the one blocking sum (dist.bucket_mb = 0), and the dist.check_every replica check
// firing on replicas made to diverge (debug.diverge_*_steps), bench's per-device MFU under
// two ranks, and one log line per warning of the job. docs/DESIGN.md §7.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace fs = std::filesystem;

namespace {

gnmr_test::CommandResult run_two_ranks(const std::string& args) {
  return gnmr_test::run_gnmr_mpi(GNMR_MPIEXEC, 2, args);
}

// 4 steps of two micro-steps each (512 tokens = 2 ranks × 2 × 4 × 32), so the buckets must
// wait for the second backward; eval and checkpoint only at the end.
std::string overlap_config(const std::string& dir) {
  return gnmr_test::write_tiny_config(
      dir, R"({"train": {"threads": 1, "steps": 4, "global_batch_tokens": 512},
               "eval": {"every": 0, "tokens": 256}, "checkpoint": {"every": 0}})");
}

TEST(CliOverlap, BucketedSumTrainsTheSameBitsAsOneBlockingSum) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_overlap_bits");
  const std::string config = overlap_config(dir);
  // 0.05 MiB = 13107 floats: each layer of the tiny model (0.19 MiB) is several buckets, the
  // embedding and lm_head (1 MiB each) one each.
  auto blocking = run_two_ranks("train --config " + config + " --out " + dir +
                                "/blocking --set dist.bucket_mb=0 --set dist.check_every=1");
  ASSERT_EQ(blocking.exit_code, 0) << blocking.output;
  auto bucketed = run_two_ranks("train --config " + config + " --out " + dir +
                                "/bucketed --set dist.bucket_mb=0.05 --set dist.check_every=1");
  ASSERT_EQ(bucketed.exit_code, 0) << bucketed.output;
  // The bucketed run did take the overlapped path, with more than one bucket.
  const std::string said = "gradient sum over 2 ranks: ";
  const size_t at = bucketed.output.find(said);
  ASSERT_NE(at, std::string::npos) << bucketed.output;
  EXPECT_GT(std::stoi(bucketed.output.substr(at + said.size())), 2) << bucketed.output;
  EXPECT_EQ(blocking.output.find(said), std::string::npos) << blocking.output;

  const std::string weights = "/checkpoints/step_00000004/model.safetensors";
  const std::string a = gnmr_test::read_bytes(dir + "/blocking" + weights);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == gnmr_test::read_bytes(dir + "/bucketed" + weights))
      << "the bucketed run's weights differ from the blocking run's";
  auto lines_a = gnmr_test::read_metrics(dir + "/blocking/metrics.jsonl");
  auto lines_b = gnmr_test::read_metrics(dir + "/bucketed/metrics.jsonl");
  ASSERT_EQ(lines_a.size(), lines_b.size());
  int train_lines = 0;
  for (size_t i = 0; i < lines_a.size(); ++i) {
    if (lines_a[i]["kind"] != "train") continue;
    train_lines += 1;
    EXPECT_EQ(lines_a[i]["loss"].get<double>(), lines_b[i]["loss"].get<double>()) << i;
    EXPECT_EQ(lines_a[i]["grad_norm"].get<double>(), lines_b[i]["grad_norm"].get<double>()) << i;
  }
  EXPECT_EQ(train_lines, 4);
}

// Under 2 ranks bench's MFU is per device: the job's throughput shared by the ranks, against
// one device's peak (a job-wide figure over one device's peak would read W times too high).
TEST(CliOverlap, BenchUnderTwoRanksQuotesMfuPerDevice) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string config = overlap_config(gnmr_test::scratch_dir("cli_overlap_bench"));
  auto r = run_two_ranks("bench --config " + config + " --steps 1 --warmup 0 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // One report for the job: two ranks printing theirs at once interleave mid-line under mpirun.
  size_t reports = 0;
  for (size_t at = r.output.find("\n  tokens/s "); at != std::string::npos;
       at = r.output.find("\n  tokens/s ", at + 1)) {
    ++reports;
  }
  EXPECT_EQ(reports, 1u) << r.output;
  const nlohmann::json figures = gnmr_test::last_json_line(r.output);
  ASSERT_TRUE(figures.is_object()) << r.output;
  EXPECT_EQ(figures["world_size"].get<int>(), 2);
  EXPECT_DOUBLE_EQ(figures["achieved_gflops_per_rank"].get<double>(),
                   figures["achieved_gflops"].get<double>() / 2);
  EXPECT_DOUBLE_EQ(figures["mfu"].get<double>(), figures["achieved_gflops"].get<double>() / 2 /
                                                     figures["gemm_peak_gflops"].get<double>());
}

TEST(CliOverlap, ReplicaCheckStopsEveryRankWhenWeightsOrPlansDiverge) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_overlap_check");
  const std::string config = overlap_config(dir);
  auto weights = run_two_ranks("train --config " + config + " --out " + dir +
                               "/weights --set dist.check_every=2 --set "
                               "debug.diverge_weights_steps=[2]");
  EXPECT_EQ(weights.exit_code, 1) << weights.output;  // ErrorKind::Runtime
  EXPECT_NE(weights.output.find("step 2 (dist.check_every): the ranks' weights differ"),
            std::string::npos)
      << weights.output;
  EXPECT_FALSE(fs::exists(dir + "/weights/checkpoints/step_00000004"));

  auto plan = run_two_ranks("train --config " + config + " --out " + dir +
                            "/plan --set dist.check_every=2 --set debug.diverge_plan_steps=[2]");
  EXPECT_EQ(plan.exit_code, 1) << plan.output;
  EXPECT_NE(plan.output.find("step 2 (dist.check_every): the ranks' routing plans"),
            std::string::npos)
      << plan.output;
  // A divergence at a step the check does not visit goes unseen until the next check.
  auto unseen = run_two_ranks("train --config " + config + " --out " + dir +
                              "/unseen --set dist.check_every=4 --set "
                              "debug.diverge_weights_steps=[3]");
  EXPECT_EQ(unseen.exit_code, 1) << unseen.output;
  EXPECT_NE(unseen.output.find("step 4 (dist.check_every): the ranks' weights differ"),
            std::string::npos)
      << unseen.output;
}

}  // namespace

// A warning about the job's settings or data is the same on every rank: rank 0 says it, once
// (64 copies of each would bury a 64-GPU job's log). Shards without a prepare.json, a warm-up
// as long as the run, no data.tokenizer and a non-finite step give four such warnings.
TEST(CliOverlap, EachWarningOfTheJobIsLoggedOnceNotOncePerRank) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_overlap_warnings");
  fs::create_directories(dir + "/shards");
  fs::copy_file(gnmr_test::brown_shards_dir() + "/train_000000.bin",
                dir + "/shards/train_000000.bin", fs::copy_options::overwrite_existing);
  const std::string config = gnmr_test::write_tiny_config(
      dir, R"({"data": {"train": ")" + dir + R"(/shards/train_*.bin", "val": "", "tokenizer": ""},
               "train": {"threads": 1, "steps": 2, "warmup_steps": 2, "global_batch_tokens": 512},
               "eval": {"every": 0}, "checkpoint": {"every": 0},
               "debug": {"nonfinite_grad_steps": [1]}})");
  auto r = run_two_ranks("train --config " + config + " --out " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto count = [&](const std::string& text) {
    int n = 0;
    for (size_t at = r.output.find(text); at != std::string::npos; at = r.output.find(text, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("holds no prepare.json"), 1) << r.output;
  EXPECT_EQ(count("train.warmup_steps 2 is not below train.steps 2"), 1) << r.output;
  EXPECT_EQ(count("data.tokenizer is not set"), 1) << r.output;
  EXPECT_EQ(count("step 1: non-finite loss or gradient"), 1) << r.output;
}
