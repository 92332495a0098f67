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

// Every regular file under DIR (relative path -> bytes), bar the run's lock file (DirectoryLock),
// which a run takes before it reads the directory.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().filename() != ".gnmr.lock") {
      files[fs::relative(entry.path(), dir).string()] =
          gnmr_test::read_bytes(entry.path().string());
    }
  }
  return files;
}

// Trains the tiny config with EXTRA merged in to the end, in RUN under a scratch directory
// named NAME; returns the config's path.
std::string finished_run(const std::string& name, const std::string& extra, std::string& run) {
  const std::string dir = gnmr_test::scratch_dir(name);
  const std::string config = gnmr_test::write_tiny_config(dir, extra);
  run = dir + "/run";
  EXPECT_EQ(run_gnmr(train_args(config, run)).exit_code, 0);
  return config;
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
  std::string run;
  const std::string config = finished_run(
      "cli_resume_before_checkpoint",
      R"({"train": {"steps": 3}, "eval": {"every": 0}, "checkpoint": {"every": 0}})", run);
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

// Going back to an older checkpoint of the run (to lower the lr after a spike): the later
// checkpoints were once kept in place of the new run's ("identical by the bit-exact resume
// guarantee", which a changed lr breaks), so --resume auto continued the old run. Now they and
// the old metrics are kept aside, and the new run's checkpoints are its own.
TEST(CliRunDir, GoingBackToAnOlderCheckpointKeepsTheLaterOnesAsideAndWritesItsOwn) {
  std::string run;
  const std::string config = finished_run(
      "cli_go_back", R"({"train": {"steps": 6}, "eval": {"every": 0}, "checkpoint": {"every": 2}})",
      run);
  const std::string old_step6 =
      gnmr_test::read_bytes(run + "/checkpoints/step_00000006/model.safetensors");
  const std::string old_metrics = gnmr_test::read_bytes(run + "/metrics.jsonl");
  // What `checkpoint consolidate` names after a step goes with it.
  fs::copy(run + "/checkpoints/step_00000006", run + "/checkpoints/step_00000006_consolidated",
           fs::copy_options::recursive);
  auto back = run_gnmr(train_args(config, run) +
                       " --set train.lr=0.001 --set 'precision.recovery_layers=[0]' --resume " +
                       run + "/checkpoints/step_00000002");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_NE(back.output.find("going back to step 2"), std::string::npos) << back.output;
  // config.json is rewritten with the new lr: the log says what changed since the checkpoint.
  EXPECT_NE(back.output.find("settings changed since " + run + "/checkpoints/step_00000002: "),
            std::string::npos)
      << back.output;
  EXPECT_NE(back.output.find("train.lr 0.003 -> 0.001"), std::string::npos) << back.output;
  // A list is one value (it was logged element by element, [] as null).
  EXPECT_NE(back.output.find("precision.recovery_layers [] -> [0]"), std::string::npos)
      << back.output;
  const std::string kept = run + "/abandoned_after_step_2";
  EXPECT_EQ(gnmr_test::read_bytes(kept + "/checkpoints/step_00000006/model.safetensors"),
            old_step6);
  EXPECT_TRUE(fs::exists(kept + "/checkpoints/step_00000004"));
  EXPECT_TRUE(fs::exists(kept + "/checkpoints/step_00000006_consolidated"));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_00000006_consolidated"));
  EXPECT_EQ(gnmr_test::read_bytes(kept + "/metrics.jsonl"), old_metrics);
  EXPECT_NE(gnmr_test::read_bytes(run + "/checkpoints/step_00000006/model.safetensors"), old_step6)
      << "the new run's step 6 (another lr) must be its own";
  // A second go-back to the same step keeps its own copy.
  ASSERT_EQ(run_gnmr(train_args(config, run) + " --resume " + run + "/checkpoints/step_00000002")
                .exit_code,
            0);
  EXPECT_TRUE(fs::exists(run + "/abandoned_after_step_2_2/checkpoints/step_00000006"));
}

// A go-back that cannot copy the run's files aside (a full disk; here a file size limit of
// 2 KiB against a metrics.jsonl of more) once left a half-filled abandoned_after_step_S/
// and exited 5. Undone now: nothing of the run moves, exit 1 naming the cause.
TEST(CliRunDir, AGoBackThatCannotKeepTheLaterCheckpointsChangesNothing) {
  std::string run;
  const std::string config = finished_run(
      "cli_go_back_full",
      R"({"train": {"steps": 6}, "eval": {"every": 0}, "checkpoint": {"every": 2}})", run);
  const std::string metrics = gnmr_test::read_bytes(run + "/metrics.jsonl");
  ASSERT_GT(metrics.size(), 2048u);
  std::ofstream(run + "/../go_back.sh")
      << "ulimit -f 2; '" << gnmr_test::gnmr_binary() << "' " << train_args(config, run)
      << " --resume " << run << "/checkpoints/step_00000002 2>&1\n";
  auto r = gnmr_test::run_command("bash '" + run + "/../go_back.sh'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the run directory was left as it was"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run + "/abandoned_after_step_2"));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_00000006"));
  EXPECT_EQ(gnmr_test::read_bytes(run + "/metrics.jsonl"), metrics);
}

// --resume of another run's checkpoint into a directory that holds a run once cut that run's
// metrics, overwrote its config and mixed the two runs' checkpoints (with checkpoint.keep, the
// new ones were removed first). Refused now, the run unchanged.
TEST(CliRunDir, ResumingAnotherRunsCheckpointIntoARunIsRefusedAndChangesNothing) {
  std::string dir = gnmr_test::scratch_dir("cli_resume_foreign");
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 4}, "eval": {"every": 0}, "checkpoint": {"every": 2}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/a")).exit_code, 0);
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/b")).exit_code, 0);
  const auto before = snapshot(dir + "/b");
  auto r = run_gnmr(train_args(config, dir + "/b") + " --resume " + dir +
                    "/a/checkpoints/step_00000002");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("already holds a run, and --resume " + dir +
                          "/a/checkpoints/step_00000002 is not one of its checkpoints"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(snapshot(dir + "/b") == before);
  // Into a new --out it starts a run from that checkpoint, as before.
  auto branch = run_gnmr(train_args(config, dir + "/c") + " --resume " + dir +
                         "/a/checkpoints/step_00000002");
  EXPECT_EQ(branch.exit_code, 0) << branch.output;
  // And --init cannot ride along with an explicit checkpoint.
  auto both =
      run_gnmr(train_args(config, dir + "/d") + " --resume " + dir +
               "/a/checkpoints/step_00000002 --init " + dir + "/a/checkpoints/step_00000004");
  EXPECT_EQ(both.exit_code, 2) << both.output;
}

// --stop-at bounds what a job trains, also when it resumes at or past it.
TEST(CliRunDir, StopAtHoldsWhenTheRunResumesPastIt) {
  std::string dir = gnmr_test::scratch_dir("cli_stop_at_resume");
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 8}, "eval": {"every": 0}, "checkpoint": {"every": 4}})");
  const std::string run = dir + "/run";
  ASSERT_EQ(run_gnmr(train_args(config, run) + " --stop-at 4").exit_code, 0);
  auto again = run_gnmr(train_args(config, run) + " --stop-at 2 --resume auto");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("--stop-at 2: the run is already at step 4; nothing to train"),
            std::string::npos)
      << again.output;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_00000008")) << again.output;
  EXPECT_EQ(again.output.find("final loss"), std::string::npos) << "no step, no loss to report";
}

// The error that ends a run reaches its log.txt, not only stderr.
TEST(CliRunDir, TheErrorThatEndsARunIsInItsLog) {
  std::string dir = gnmr_test::scratch_dir("cli_error_in_log");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 4}, "eval": {"every": 0},
               "debug": {"nonfinite_grad_steps": [1, 2, 3]}})");
  auto r = run_gnmr(train_args(config, dir + "/run"));
  ASSERT_EQ(r.exit_code, 6) << r.output;
  EXPECT_NE(
      gnmr_test::read_bytes(dir + "/run/log.txt").find("error training stopped: 3 consecutive"),
      std::string::npos)
      << gnmr_test::read_bytes(dir + "/run/log.txt");
}

// A metrics line that cannot be written (a full disk; here a 16 KiB file-size limit) once went
// missing without a word, the run exiting 0 with a gap and a torn line in metrics.jsonl.
TEST(CliRunDir, AMetricsLineThatCannotBeWrittenStopsTheRun) {
  std::string dir = gnmr_test::scratch_dir("cli_metrics_full");
  // 60 steps of ~500-byte lines pass 16 KiB near step 32; log.txt (one step line) and
  // config.json stay far below it, and the last step's checkpoint is never reached.
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 60}, "eval": {"every": 0}, "checkpoint": {"every": 0},
               "log": {"every": 1000}})");
  // No `trap '' XFSZ`: gnmr ignores SIGXFSZ itself (it once died of it, unsaid).
  std::ofstream(dir + "/run.sh") << "ulimit -f 16; '" << gnmr_test::gnmr_binary() << "' "
                                 << train_args(config, dir + "/run") << " 2>&1\n";
  auto r = gnmr_test::run_command("bash '" + dir + "/run.sh'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("write " + dir + "/run/metrics.jsonl: File too large; the run stops"),
            std::string::npos)
      << r.output;
  EXPECT_NE(gnmr_test::read_bytes(dir + "/run/log.txt").find("metrics.jsonl: File too large"),
            std::string::npos);
}

// A second `gnmr train` into a directory a run is training in (a resubmitted job, an orphaned
// child of an interrupted script) once resumed from the running one's checkpoints and replaced
// them under it. Refused now, naming the holder; the first run goes on to its end.
TEST(CliRunDir, ASecondTrainingIntoADirectoryInUseIsRefused) {
  const std::string dir = gnmr_test::scratch_dir("cli_run_dir_lock");
  const std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 100000}, "eval": {"every": 0}, "checkpoint": {"every": 0}})");
  const std::string gnmr = "'" + gnmr_test::gnmr_binary() + "' ";
  // The first run is stopped by SIGTERM (a checkpoint, exit 0) once the second has been refused
  // (without the lock, the second started the first over, for 2 steps, and exited 0).
  std::ofstream(dir + "/run.sh") << gnmr << train_args(config, dir + "/run") << " >'" << dir
                                 << "/first.txt' 2>&1 & pid=$!\n"
                                 << "for i in $(seq 1 600); do grep -q 'step ' '" << dir
                                 << "/run/log.txt' 2>/dev/null && break; sleep 0.05; done\n"
                                 << gnmr << train_args(config, dir + "/run")
                                 << " --resume auto --steps 2 2>&1; echo second=$?\n"
                                 << "kill -TERM $pid; wait $pid; echo first=$?\n";
  auto r = gnmr_test::run_command("bash '" + dir + "/run.sh'");
  EXPECT_NE(r.output.find("second=5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is in use by another gnmr process: pid "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("first=0"), std::string::npos)
      << r.output << gnmr_test::read_bytes(dir + "/first.txt");
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/first.txt").find("error"), std::string::npos);
}

// Ctrl-C or a closed terminal once killed the trainer at once: the steps since the last
// checkpoint were lost, and log.txt said nothing. Now they stop it as SIGTERM does (the step
// ends, a checkpoint, a log line), and it then ends by the signal (a shell loop stops).
TEST(CliRunDir, SigintAndSighupCheckpointAndEndByTheSignal) {
  const std::string dir = gnmr_test::scratch_dir("cli_run_dir_sigint");
  const std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 100000}, "eval": {"every": 0}, "checkpoint": {"every": 0}})");
  const std::string gnmr = "'" + gnmr_test::gnmr_binary() + "' ";
  for (const std::string signal : {"INT", "HUP"}) {
    SCOPED_TRACE(signal);
    const std::string run = dir + "/run_" + signal;
    // Job control on, so the background job's SIGINT is not ignored (as it is in a script).
    std::ofstream(dir + "/run.sh") << "set -m\n"
                                   << gnmr << train_args(config, run) << " 2>&1 & pid=$!\n"
                                   << "for i in $(seq 1 600); do grep -q 'step ' '" << run
                                   << "/log.txt' 2>/dev/null && break; sleep 0.05; done\n"
                                   << "kill -" << signal << " $pid; wait $pid; echo status=$?\n";
    auto r = gnmr_test::run_command("bash '" + dir + "/run.sh'");
    EXPECT_NE(r.output.find(signal == "INT" ? "status=130" : "status=129"), std::string::npos)
        << r.output;
    const std::string log = gnmr_test::read_bytes(run + "/log.txt");
    EXPECT_NE(log.find(signal == "INT" ? "(signal 2 (Interrupt)); checkpointed"
                                       : "(signal 1 (Hangup)); checkpointed"),
              std::string::npos)
        << log;
    bool checkpointed = false;
    for (const auto& entry : fs::directory_iterator(run + "/checkpoints")) {
      checkpointed |= entry.path().filename().string().rfind("step_", 0) == 0;
    }
    EXPECT_TRUE(checkpointed);
  }
}
