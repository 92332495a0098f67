// Running the gnmr binary from tests, and a prepared copy of the bundled Brown corpus
// shared by every test process (made once, published by an atomic rename).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace gnmr_test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line in the test's working directory, stdout and stderr together.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.output.append(buffer.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs `gnmr ARGS` through the shell in the test's working directory; `env` holds extra
// environment assignments ("NAME=VALUE NAME2=VALUE2") for that process.
inline CommandResult run_gnmr(const std::string& args, const std::string& env = "") {
  return run_command((env.empty() ? "" : "env " + env + " ") + "'" + gnmr_binary() + "' " + args +
                     " 2>&1");
}

// Runs `gnmr ARGS` as `ranks` processes under `mpiexec` (Open MPI's mpirun, as root and on more
// ranks than cores, as CI runs), behind `wrapper` (e.g. "timeout 120") when given. Each test
// process's jobs keep their session directory under a base of its own: Open MPI 4.1 makes
// /tmp/ompi.HOST.UID on a job's start and removes it at its end, and two jobs starting at once
// (ctest -j) can both try to make it, one failing with "File exists" (open-mpi/ompi#8510).
inline CommandResult run_gnmr_mpi(const std::string& mpiexec, int ranks, const std::string& args,
                                  const std::string& wrapper = "") {
  const std::string session_base = "/tmp/gnmr_ompi." + std::to_string(getpid());
  std::filesystem::create_directories(session_base);
  CommandResult r = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_orte_tmpdir_base='" +
      session_base + "' " + wrapper + " '" + mpiexec + "' -np " + std::to_string(ranks) +
      " --oversubscribe '" + gnmr_binary() + "' " + args + " 2>&1");
  std::error_code ignored;
  std::filesystem::remove_all(session_base, ignored);
  return r;
}

struct RanksResult {
  std::vector<int> exit_codes;  // rank r's; -1 when it left none (killed by a signal)
  std::string output;           // every rank's output, rank 0's first
  bool all_succeeded() const {
    for (int code : exit_codes) {
      if (code != 0) return false;
    }
    return !exit_codes.empty();
  }
};

// `program ARGS` as `ranks` processes on this node, launched as torchrun launches them (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT on localhost: the TCP rendezvous),
// each bounded by `timeout_s` so that a hang fails the test instead of stalling the suite. Rank
// r's output goes to LOG.rankR and its exit code to LOG.rankR.code; `env` holds extra
// environment assignments ("NAME=VALUE NAME2=VALUE2") for every rank.
inline RanksResult run_ranks(const std::string& program, int ranks, const std::string& args,
                             const std::string& log, int timeout_s = 300,
                             const std::string& env = "") {
  const int port = 29000 + int(getpid() % 2000);
  std::string script = "pids=''\n";
  for (int r = 0; r < ranks; ++r) {
    const std::string out = log + ".rank" + std::to_string(r);
    std::remove((out + ".code").c_str());  // a code left by an earlier run is not this one's
    script += "(env RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(ranks) +
              " LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(ranks) +
              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + env +
              " timeout " + std::to_string(timeout_s) + " '" + program + "' " + args + " > '" +
              out + "' 2>&1; echo $? > '" + out + ".code') & pids=\"$pids $!\"\n";
  }
  script += "for p in $pids; do wait $p; done\n";
  // From a file: on a `bash -c "..."` line the calling shell would expand $pids and $? itself.
  std::ofstream(log + ".sh") << script;
  run_command("bash '" + log + ".sh'");
  RanksResult result;
  for (int r = 0; r < ranks; ++r) {
    const std::string out = log + ".rank" + std::to_string(r);
    std::ifstream code_file(out + ".code");
    int code = -1;
    if (!(code_file >> code)) code = -1;
    result.exit_codes.push_back(code);
    std::ifstream text(out);
    result.output += "--- rank " + std::to_string(r) + " (exit " + std::to_string(code) + ")\n" +
                     std::string(std::istreambuf_iterator<char>(text), {});
  }
  return result;
}

// Token shards of the bundled corpus (train_*.bin, val_*.bin), prepared on first use.
inline std::string brown_shards_dir() {
  namespace fs = std::filesystem;
  fs::path final_dir = fs::current_path() / "scratch" / "brown_shards";
  if (fs::exists(final_dir / "prepare.json")) return final_dir.string();
  fs::path tmp = fs::current_path() / "scratch" / ("brown_shards.tmp." + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp.parent_path());
  CommandResult r = run_gnmr("prepare --no-progress --val-fraction 0.05 --tokenizer '" +
                             source_path("data/brown/tokenizer.model") + "' --out '" +
                             tmp.string() + "' '" + source_path("data/brown/brown.jsonl.gz") + "'");
  if (r.exit_code != 0) {
    fs::remove_all(tmp);
    return "";
  }
  std::error_code ec;
  fs::rename(tmp, final_dir, ec);  // another test process may have won the race: use its copy
  if (ec) fs::remove_all(tmp);
  return final_dir.string();
}

}  // namespace gnmr_test
