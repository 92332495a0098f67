// The run directory contract of `gnmr train` (src/train/run_dir.h): a refused run changes
// nothing, `--resume auto` restarts a run killed before its first checkpoint, and a --out that
// is not a run directory is named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using gnmr_test::run_gnmr;

namespace {

std::string train_args(const std::string& config, const std::string& out) {
  return "train --config " + config + " --out " + out;
}

// Every regular file under DIR (relative path -> bytes).
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), dir).string()] =
          gnmr_test::read_bytes(entry.path().string());
    }
  }
  return files;
}

}  // namespace

TEST(CliRunDir, RefusedResumeChangesNoFileOfTheRun) {
  std::string dir = gnmr_test::scratch_dir("cli_refused_resume");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}, "eval": {"every": 0}})");
  const std::string run = dir + "/run";
  ASSERT_EQ(run_gnmr(train_args(config, run)).exit_code, 0);
  const auto before = snapshot(run);
  ASSERT_EQ(before.count("config.json"), 1u);
  ASSERT_EQ(before.count("log.txt"), 1u);
  ASSERT_EQ(before.count("metrics.jsonl"), 1u);

  const std::string checkpoint = run + "/checkpoints/step_00000002";
  for (const std::string& refused :
       {std::string("--resume auto --set model.n_layers=3"),
        std::string("--resume auto --set model.dim=128 --set model.n_heads=4"),
        "--resume " + checkpoint + " --set model.ffn_dim=128",
        std::string("--resume auto --set gnmr.alpha=2.5"),
        "--resume " + checkpoint + " --set gnmr.max_active=3"}) {
    auto r = run_gnmr(train_args(config, run) + " " + refused);
    EXPECT_EQ(r.exit_code, 5) << refused << "\n" << r.output;
    EXPECT_EQ(snapshot(run), before) << refused << " changed the run directory";
  }
}

TEST(CliRunDir, ResumeAutoRestartsARunKilledBeforeItsFirstCheckpoint) {
  std::string dir = gnmr_test::scratch_dir("cli_resume_before_checkpoint");
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 3}, "eval": {"every": 0}, "checkpoint": {"every": 0}})");
  const std::string run = dir + "/run";
  ASSERT_EQ(run_gnmr(train_args(config, run)).exit_code, 0);
  const auto complete = gnmr_test::read_metrics(run + "/metrics.jsonl");
  ASSERT_EQ(complete.size(), 4u);  // 3 train lines and the final eval

  // What a kill before the first checkpoint leaves: config, log, metrics ending in a torn line.
  fs::remove_all(run + "/checkpoints");
  fs::remove(run + "/gnmr_summary.json");
  std::ofstream(run + "/metrics.jsonl", std::ios::trunc)
      << complete[0].dump() << "\n"
      << complete[1].dump() << "\n{\"kind\":\"train\",\"st";
  const std::string old_log = gnmr_test::read_bytes(run + "/log.txt");

  auto r = run_gnmr(train_args(config, run) + " --resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("never reached a checkpoint"), std::string::npos) << r.output;
  const std::string log = gnmr_test::read_bytes(run + "/log.txt");
  EXPECT_EQ(log.rfind(old_log, 0), 0u) << "log.txt lost the first attempt's lines";
  EXPECT_NE(log.find("never reached a checkpoint", old_log.size()), std::string::npos) << log;
  // Started over: every step once, the same lines as the uninterrupted run.
  const auto restarted = gnmr_test::read_metrics(run + "/metrics.jsonl");
  ASSERT_EQ(restarted.size(), complete.size());
  for (size_t i = 0; i < complete.size(); ++i) {
    EXPECT_EQ(gnmr_test::without_timing(restarted[i]), gnmr_test::without_timing(complete[i]))
        << "metrics line " << i;
  }
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_00000003/trainer.json"));
}

TEST(CliRunDir, ResumeAutoRefusesADirectoryThatHoldsNoGnmrRun) {
  std::string dir = gnmr_test::scratch_dir("cli_resume_foreign_dir");
  std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}})");
  const std::string foreign = dir + "/other_tool_run";
  fs::create_directories(foreign + "/checkpoints/epoch_3");
  std::ofstream(foreign + "/checkpoints/epoch_3/model.pt") << "not ours";
  const auto before = snapshot(foreign);
  auto r = run_gnmr(train_args(config, foreign) + " --resume auto");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("does not hold a gnmr run"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(foreign), before);
}

TEST(CliRunDir, OutNamingAFileIsRefusedWithItsName) {
  std::string dir = gnmr_test::scratch_dir("cli_out_is_file");
  std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}})");
  std::ofstream(dir + "/notes.txt") << "keep me";
  for (const std::string& out : {dir + "/notes.txt", dir + "/notes.txt/run"}) {
    for (const char* flags : {"", " --resume auto", " --force"}) {
      auto r = run_gnmr(train_args(config, out) + flags);
      EXPECT_EQ(r.exit_code, 5) << out << flags << "\n" << r.output;
      EXPECT_NE(r.output.find("--out " + out), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("filesystem error"), std::string::npos) << r.output;
    }
  }
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/notes.txt"), "keep me");
}
