// The wgmma trial's process side (train/wgmma_trial.h): the command it runs, how each way a
// trial process can end becomes the answer the backend gets, and GNMR_AUTO_WGMMA. A shell
// script stands in for `gnmr wgmma-trial`; the trial itself runs in the gpu tests
// (GpuFlashAttention.AutoOffersTheWgmmaKernelsOnlyWhereTheirTrialProcessPasses).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "expect_error.h"
#include "test_paths.h"
#include "train/wgmma_trial.h"

namespace {

using gnmr::AttentionShape;

const AttentionShape kShape{8, 1024, 32, 8, 64};

// An executable script at DIR/name holding `body` (after #!/bin/sh).
std::string script(const std::filesystem::path& dir, const std::string& name,
                   const std::string& body) {
  const std::filesystem::path path = dir / name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path.string();
}

// GNMR_AUTO_WGMMA set to `value` (nullptr: unset) for a scope.
class AutoWgmmaSetting {
 public:
  explicit AutoWgmmaSetting(const char* value) {
    const char* old = std::getenv("GNMR_AUTO_WGMMA");
    if (old) old_ = old, had_ = true;
    if (value) {
      setenv("GNMR_AUTO_WGMMA", value, 1);
    } else {
      unsetenv("GNMR_AUTO_WGMMA");
    }
  }
  ~AutoWgmmaSetting() {
    if (had_) {
      setenv("GNMR_AUTO_WGMMA", old_.c_str(), 1);
    } else {
      unsetenv("GNMR_AUTO_WGMMA");
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(WgmmaTrial, RunsTheHiddenCommandOnTheGpuAtTheShapeWithAtMostTwoInTheBatch) {
  EXPECT_EQ(gnmr::wgmma_trial_command("/opt/gnmr", 3, kShape),
            (std::vector<std::string>{"/opt/gnmr", "wgmma-trial", "--device", "3", "--batch", "2",
                                      "--seq", "1024", "--heads", "32", "--kv-heads", "8",
                                      "--head-dim", "64"}));
  EXPECT_EQ(gnmr::wgmma_trial_command("gnmr", 0, AttentionShape{1, 17, 4, 2, 128})[5], "1");
}

// Exit 0 is a pass; an exit code, a signal (a kernel fault) or the deadline is an answer that
// names the command, how it ended and the process's last line.
TEST(WgmmaTrial, EveryWayTheProcessEndsBecomesTheAnswer) {
  const std::filesystem::path dir = gnmr_test::scratch_dir("wgmma_trial");
  const std::string args = (dir / "args").string();
  const std::string pass = script(dir, "pass", "echo \"$@\" > " + args + "; echo fine; exit 0");
  EXPECT_EQ(gnmr::run_wgmma_trial_process(pass, 1, kShape), "");
  std::ifstream args_file(args);
  std::string line;
  std::getline(args_file, line);
  EXPECT_EQ(line,
            "wgmma-trial --device 1 --batch 2 --seq 1024 --heads 32 --kv-heads 8 --head-dim 64");

  const std::string bits =
      script(dir, "bits",
             "echo 'gnmr: error: the forward'\\''s wgmma kernels wrote other bits' >&2; exit 1");
  EXPECT_EQ(gnmr::run_wgmma_trial_process(bits, 0, kShape),
            "the wgmma trial process (gnmr wgmma-trial --device 0 --batch 2 --seq 1024 --heads 32 "
            "--kv-heads 8 --head-dim 64) exited with code 1: gnmr: error: the forward's wgmma "
            "kernels wrote other bits");

  const std::string fault = script(dir, "fault", "echo 'launching'; kill -SEGV $$");
  const std::string faulted = gnmr::run_wgmma_trial_process(fault, 0, kShape);
  EXPECT_NE(faulted.find(") was ended by signal 11"), std::string::npos) << faulted;
  EXPECT_NE(faulted.find(": launching"), std::string::npos) << faulted;

  const std::string missing = gnmr::run_wgmma_trial_process((dir / "none").string(), 0, kShape);
  EXPECT_NE(missing.find(") did not start: cannot start " + (dir / "none").string()),
            std::string::npos)
      << missing;

  const std::string hang = script(dir, "hang", "exec sleep 30");
  const std::string hung = gnmr::run_wgmma_trial_process(hang, 0, kShape, 0.3);
  EXPECT_NE(hung.find(") ran past its 0.3 s deadline and was killed"), std::string::npos) << hung;
}

// GNMR_AUTO_WGMMA: 0 never offers, 1 offers without a trial, unset runs the trial process
// where main() named the executable (and offers nothing where it did not), anything else is an
// error naming the variable.
TEST(WgmmaTrial, GnmrAutoWgmmaChoosesNeverAlwaysOrTheTrialProcess) {
  const std::filesystem::path dir = gnmr_test::scratch_dir("wgmma_trial_env");
  {
    const AutoWgmmaSetting never("0");
    gnmr::set_wgmma_trial_executable(script(dir, "pass", "exit 0"));
    EXPECT_FALSE(gnmr::wgmma_trial_from_env(0));
  }
  {
    const AutoWgmmaSetting always("1");
    gnmr::set_wgmma_trial_executable(script(dir, "fail", "exit 1"));
    const gnmr::WgmmaTrial trial = gnmr::wgmma_trial_from_env(0);
    ASSERT_TRUE(trial);
    EXPECT_EQ(trial(kShape), "") << "1: no trial process";
  }
  {
    const AutoWgmmaSetting unset(nullptr);
    gnmr::set_wgmma_trial_executable(script(dir, "fail", "echo no; exit 1"));
    const gnmr::WgmmaTrial trial = gnmr::wgmma_trial_from_env(2);
    ASSERT_TRUE(trial);
    EXPECT_NE(trial(kShape).find("gnmr wgmma-trial --device 2 "), std::string::npos);
    EXPECT_NE(trial(kShape).find("exited with code 1: no"), std::string::npos);
    // One process per command: batches 8 and 4 both run the trial at batch 2.
    const std::string count = (dir / "count").string();
    gnmr::set_wgmma_trial_executable(script(dir, "counted", "echo x >> " + count + "; exit 0"));
    const gnmr::WgmmaTrial counted = gnmr::wgmma_trial_from_env(0);
    for (const int64_t batch : {8, 4, 8, 1}) {
      EXPECT_EQ(counted(AttentionShape{batch, 1024, 32, 8, 64}), "");
    }
    std::ifstream count_file(count);
    int runs = 0;
    for (std::string run; std::getline(count_file, run);) ++runs;
    EXPECT_EQ(runs, 2) << "batch 2 once, batch 1 once";
    gnmr::set_wgmma_trial_executable(script(dir, "hang", "exec sleep 30"));
    EXPECT_NE(gnmr::wgmma_trial_from_env(2, 0.2)(kShape).find("ran past its 0.2 s deadline"),
              std::string::npos)
        << "the deadline given";
    gnmr::set_wgmma_trial_executable("");
    EXPECT_FALSE(gnmr::wgmma_trial_from_env(2)) << "not gnmr: nothing to run the trial";
  }
  {
    const AutoWgmmaSetting typo("yes");
    gnmr_test::expect_error([] { gnmr::wgmma_trial_from_env(0); }, gnmr::ErrorKind::Usage,
                            {"GNMR_AUTO_WGMMA is \"yes\"", "unset (a trial process decides)"});
  }
}

}  // namespace
