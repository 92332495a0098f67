#include <gtest/gtest.h>

#include <chrono>
#include <csignal>

#include "expect_error.h"
#include "util/child_process.h"

namespace {

using gnmr::ChildOutcome;
using gnmr::run_child_process;

// A shell script as the child: `sh -c SCRIPT`.
ChildOutcome run_shell(const std::string& script, double timeout_s = 30) {
  return run_child_process({"/bin/sh", "-c", script}, timeout_s);
}

// Its exit code and both streams, in the order written.
TEST(ChildProcess, GivesTheExitCodeAndBothStreams) {
  const ChildOutcome ok = run_shell("echo out; echo err >&2; echo last");
  EXPECT_TRUE(ok.succeeded());
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_EQ(ok.output, "out\nerr\nlast\n");
  EXPECT_EQ(gnmr::last_output_line(ok.output), "last");

  const ChildOutcome failed = run_shell("echo 'no device'; exit 3");
  EXPECT_FALSE(failed.succeeded());
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_EQ(failed.signal, 0);
  EXPECT_FALSE(failed.timed_out);
  EXPECT_EQ(gnmr::child_ending_text(failed, 30), "exited with code 3");
  EXPECT_EQ(gnmr::last_output_line(failed.output), "no device");
}

// A child that a signal ends (a kernel fault ends a CUDA process with SIGSEGV or SIGABRT) is
// reported as such, with what it wrote first.
TEST(ChildProcess, SaysWhichSignalEndedIt) {
  const ChildOutcome crashed = run_shell("echo 'launching'; kill -SEGV $$");
  EXPECT_FALSE(crashed.succeeded());
  EXPECT_EQ(crashed.signal, SIGSEGV);
  EXPECT_FALSE(crashed.timed_out);
  EXPECT_EQ(gnmr::last_output_line(crashed.output), "launching");
  EXPECT_NE(gnmr::child_ending_text(crashed, 30).find("signal 11"), std::string::npos)
      << gnmr::child_ending_text(crashed, 30);
}

// A child past its deadline is killed then, not waited for; a child that closes its streams
// early is still waited for.
TEST(ChildProcess, KillsAChildPastItsDeadline) {
  const auto start = std::chrono::steady_clock::now();
  const ChildOutcome hung = run_shell("echo started; exec sleep 30", 0.5);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(hung.timed_out);
  EXPECT_EQ(hung.signal, SIGKILL);
  EXPECT_FALSE(hung.succeeded());
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(gnmr::last_output_line(hung.output), "started");
  EXPECT_EQ(gnmr::child_ending_text(hung, 0.5), "ran past its 0.5 s deadline and was killed");

  const ChildOutcome quiet = run_shell("exec >&- 2>&-; sleep 0.3; exit 4");
  EXPECT_EQ(quiet.exit_code, 4);
  EXPECT_FALSE(quiet.timed_out);
}

// Only the last kChildOutputKept bytes come back.
TEST(ChildProcess, KeepsTheEndOfALongOutput) {
  const ChildOutcome long_output = run_shell(
      "i=0; while [ $i -lt 2000 ]; do echo line $i; "
      "i=$((i+1)); done");
  EXPECT_EQ(long_output.output.size(), gnmr::kChildOutputKept);
  EXPECT_EQ(gnmr::last_output_line(long_output.output), "line 1999");
}

TEST(ChildProcess, AProgramThatCannotStartIsAnErrorNamingIt) {
  gnmr_test::expect_error([] { run_child_process({"/nonexistent/gnmr"}, 5); },
                          gnmr::ErrorKind::Runtime, {"cannot start /nonexistent/gnmr"});
}

}  // namespace
