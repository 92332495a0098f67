// Damaged and incomplete checkpoints end to end: `train --resume`, `eval` and `export` name the
// missing or damaged file (exit 5), `--resume auto` falls back to the previous intact
// checkpoint and still ends bit-exactly where an uninterrupted run does, and temporary
// directories left by a killed writer are removed at the next start.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using gnmr_test::run_gnmr;

namespace {

std::string train_args(const std::string& config, const std::string& out) {
  return "train --config " + config + " --out " + out;
}

std::string val_data() {
  return " --data '" + gnmr_test::brown_shards_dir() + "/val_*.bin' --tokens 1024";
}

using gnmr_test::flip_byte;

void expect_exit_five_naming(const gnmr_test::CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

// A 2-step run in DIR/run (its config in CONFIG); returns its checkpoint.
std::string two_step_run(const std::string& dir, std::string& config) {
  config = gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}, "eval": {"every": 0}})");
  EXPECT_EQ(run_gnmr(train_args(config, dir + "/run")).exit_code, 0);
  return dir + "/run/checkpoints/step_00000002";
}

}  // namespace

TEST(CliCheckpoint, ResumeAutoSkipsADamagedNewestCheckpointAndEndsLikeAnUninterruptedRun) {
  std::string dir = gnmr_test::scratch_dir("cli_ckpt_damaged");
  std::string config = gnmr_test::write_tiny_config(dir, R"({"checkpoint": {"every": 3}})");
  auto whole = run_gnmr(train_args(config, dir + "/whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto first = run_gnmr(train_args(config, dir + "/split") + " --stop-at 6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string damaged = dir + "/split/checkpoints/step_00000006";
  flip_byte(damaged + "/model.safetensors",
            std::streamoff(fs::file_size(damaged + "/model.safetensors") / 2));
  const std::string named = damaged + ": model.safetensors is damaged (checksum mismatch";

  // Naming the damaged checkpoint is refused by every command that reads it.
  expect_exit_five_naming(run_gnmr(train_args(config, dir + "/split") + " --resume " + damaged),
                          named);
  expect_exit_five_naming(run_gnmr("eval --checkpoint " + damaged + val_data()), named);
  expect_exit_five_naming(
      run_gnmr("export --checkpoint " + damaged + " --out " + dir + "/exports/hf"), named);
  EXPECT_FALSE(fs::exists(dir + "/exports/hf"));

  auto second = run_gnmr(train_args(config, dir + "/split") + " --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::string log = gnmr_test::read_bytes(dir + "/split/log.txt");
  EXPECT_NE(log.find("skipping checkpoint " + named), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + dir + "/split/checkpoints/step_00000003"), std::string::npos)
      << log;

  for (const char* step : {"step_00000006", "step_00000012"}) {  // step 6 was saved again
    gnmr_test::expect_same_checkpoint_files(dir + "/whole/checkpoints/" + step,
                                            dir + "/split/checkpoints/" + step);
  }
  gnmr_test::expect_same_metrics(dir + "/whole", dir + "/split");
}

TEST(CliCheckpoint, AMissingFileIsNamedByResumeEvalAndExport) {
  std::string dir = gnmr_test::scratch_dir("cli_ckpt_missing");
  std::string config;
  const std::string ckpt = two_step_run(dir, config);
  fs::remove(ckpt + "/model.safetensors");
  const std::string named = ckpt + ": model.safetensors is missing";
  expect_exit_five_naming(run_gnmr(train_args(config, dir + "/run") + " --resume " + ckpt), named);
  expect_exit_five_naming(run_gnmr(train_args(config, dir + "/run") + " --resume auto"), named);
  expect_exit_five_naming(run_gnmr("eval --checkpoint " + ckpt + val_data()), named);
  expect_exit_five_naming(run_gnmr("export --checkpoint " + ckpt + " --out " + dir + "/hf"), named);
}

// A damaged optimizer state once made intact weights unusable: eval, export and --init refused
// the checkpoint, and the resume error's only advice, --force, deleted it. Resuming is still
// refused (it needs the moments); everything that reads only the weights works, and the error
// says so before it names --force.
TEST(CliCheckpoint, ADamagedOptimizerStateLeavesTheWeightsUsable) {
  std::string dir = gnmr_test::scratch_dir("cli_ckpt_optimizer_damaged");
  std::string config;
  const std::string ckpt = two_step_run(dir, config);
  fs::resize_file(ckpt + "/optimizer.safetensors", 100);
  fs::remove(ckpt + "/trainer.json");
  auto resumed = run_gnmr(train_args(config, dir + "/run") + " --resume auto");
  expect_exit_five_naming(resumed, ckpt + ": trainer.json is missing");
  EXPECT_NE(resumed.output.find("its weights are intact: `gnmr train --init " + ckpt),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("--force restarts the run from step 0 and deletes"),
            std::string::npos)
      << resumed.output;
  auto evaluated = run_gnmr("eval --checkpoint " + ckpt + val_data());
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.output;
  auto exported = run_gnmr("export --checkpoint " + ckpt + " --out " + dir + "/hf");
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  auto initialised = run_gnmr(train_args(config, dir + "/again") + " --init " + ckpt);
  EXPECT_EQ(initialised.exit_code, 0) << initialised.output;
  // The weights themselves are still checked.
  gnmr_test::flip_byte(ckpt + "/model.safetensors", 200);
  expect_exit_five_naming(run_gnmr("eval --checkpoint " + ckpt + val_data()),
                          ckpt + ": model.safetensors is damaged");
}

TEST(CliCheckpoint, StaleTemporaryDirectoriesAreRemovedAtTheNextStart) {
  std::string dir = gnmr_test::scratch_dir("cli_ckpt_stale");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 4}, "eval": {"every": 0},
                                                           "checkpoint": {"every": 2}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run") + " --stop-at 2").exit_code, 0);
  // What a writer killed while saving step 4 leaves (its pid is no live process).
  const std::string stale = dir + "/run/checkpoints/.tmp_step_00000004_999999999";
  fs::create_directories(stale);
  std::ofstream(stale + "/model.safetensors") << "partial";
  auto resumed = run_gnmr(train_args(config, dir + "/run") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(fs::exists(stale));
  const std::string log = gnmr_test::read_bytes(dir + "/run/log.txt");
  EXPECT_NE(log.find("removed stale temporary directory " + stale), std::string::npos) << log;
  for (const auto& entry : fs::directory_iterator(dir + "/run/checkpoints")) {
    EXPECT_EQ(entry.path().filename().string().rfind(".tmp_", 0), std::string::npos)
        << entry.path();
  }
}
