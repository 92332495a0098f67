// Running a program as a child process with a deadline, for work that may take the process
// down with it: the wgmma trial (train/wgmma_trial.h) runs kernels that have never run on the
// GPU in front of it, and a kernel that faults ends its process. The child's stdout and stderr
// come back (the last kChildOutputKept bytes), and a child past its deadline is killed.
#pragma once

#include <string>
#include <vector>

namespace gnmr {

constexpr size_t kChildOutputKept = 4096;

struct ChildOutcome {
  bool timed_out = false;  // killed (SIGKILL) at the deadline
  int exit_code = -1;      // its exit status, where it exited
  int signal = 0;          // the signal that ended it, where one did (SIGKILL after a timeout)
  std::string output;      // its stdout and stderr as written, the last kChildOutputKept bytes
  bool succeeded() const { return !timed_out && signal == 0 && exit_code == 0; }
};

// Runs argv[0] (a path, not searched on PATH) with arguments argv, this process's environment,
// and stdout and stderr into one pipe; waits for it to end, or kills it after timeout_s
// seconds. Error(Runtime) naming the program when it cannot be started.
ChildOutcome run_child_process(const std::vector<std::string>& argv, double timeout_s);

// How it ended, for a message: "exited with code 3", "was ended by signal 11 (Segmentation
// fault)", "ran past its 60 s deadline and was killed".
std::string child_ending_text(const ChildOutcome& outcome, double timeout_s);

// The last non-empty line of `output` ("" if none).
std::string last_output_line(const std::string& output);

}  // namespace gnmr
