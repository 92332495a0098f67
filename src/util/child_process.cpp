#include "util/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <sstream>
#include <thread>

#include "util/error.h"

extern char** environ;

namespace gnmr {

namespace {

// Appends what `fd` holds now to `output`, keeping its last kChildOutputKept bytes; false at
// the end of the pipe.
bool read_available(int fd, std::string& output) {
  char buffer[4096];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  output.append(buffer, size_t(n));
  if (output.size() > kChildOutputKept) output.erase(0, output.size() - kChildOutputKept);
  return true;
}

void record_status(int status, ChildOutcome& outcome) {
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
}

}  // namespace

ChildOutcome run_child_process(const std::vector<std::string>& argv, double timeout_s) {
  GNMR_CHECK(!argv.empty(), "run_child_process without a program");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    throw Error(ErrorKind::Runtime, "cannot start " + argv[0] + ": pipe: " + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears close-on-exec on the copies: the child writes both streams into the pipe.
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    throw Error(ErrorKind::Runtime, "cannot start " + argv[0] + ": " + std::strerror(spawned));
  }

  ChildOutcome outcome;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool pipe_open = true;
  for (;;) {
    int status = 0;
    const pid_t ended = waitpid(pid, &status, WNOHANG);
    if (ended < 0 && errno != EINTR) {
      const std::string why = std::strerror(errno);
      kill(pid, SIGKILL);
      close(pipe_fds[0]);
      throw Error(ErrorKind::Runtime, "waiting for " + argv[0] + ": " + why);
    }
    if (ended == pid) {
      // What it wrote before it ended is in the pipe; a process it started may still hold the
      // pipe open, so read only what is there.
      while (pipe_open) {
        pollfd ready{pipe_fds[0], POLLIN, 0};
        if (poll(&ready, 1, 0) <= 0) break;
        pipe_open = read_available(pipe_fds[0], outcome.output);
      }
      record_status(status, outcome);
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      record_status(status, outcome);
      outcome.timed_out = true;
      break;
    }
    const int wait_ms = int(std::min<int64_t>(left.count(), 50));
    if (pipe_open) {
      pollfd ready{pipe_fds[0], POLLIN, 0};
      if (poll(&ready, 1, wait_ms) > 0) pipe_open = read_available(pipe_fds[0], outcome.output);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    }
  }
  close(pipe_fds[0]);
  return outcome;
}

std::string child_ending_text(const ChildOutcome& outcome, double timeout_s) {
  std::ostringstream text;
  if (outcome.timed_out) {
    text << "ran past its " << timeout_s << " s deadline and was killed";
  } else if (outcome.signal != 0) {
    text << "was ended by signal " << outcome.signal << " (" << strsignal(outcome.signal) << ")";
  } else {
    text << "exited with code " << outcome.exit_code;
  }
  return text.str();
}

std::string last_output_line(const std::string& output) {
  size_t end = output.find_last_not_of("\r\n");
  if (end == std::string::npos) return "";
  const size_t start = output.rfind('\n', end);
  return output.substr(start == std::string::npos ? 0 : start + 1,
                       end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace gnmr
