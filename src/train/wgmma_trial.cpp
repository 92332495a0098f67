#include "train/wgmma_trial.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>

#include "util/child_process.h"
#include "util/error.h"
#ifdef GNMR_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gnmr {

namespace {

std::string& trial_executable() {
  static std::string path;
  return path;
}

}  // namespace

void set_wgmma_trial_executable(const std::string& path) {
  trial_executable() = path;
}

WgmmaTrial wgmma_trial_from_env(int device, double timeout_s) {
  const char* value = std::getenv("GNMR_AUTO_WGMMA");
  const std::string setting = value ? value : "";
  if (setting == "0") return {};
  if (setting == "1") return [](const AttentionShape&) { return std::string(); };
  if (!setting.empty()) {
    throw Error(ErrorKind::Usage, "GNMR_AUTO_WGMMA is \"" + setting +
                                      "\": 0 (auto never runs the wgmma attention kernels), 1 "
                                      "(it may, without a trial) or unset (a trial process "
                                      "decides)");
  }
  const std::string executable = trial_executable();
  if (executable.empty()) return {};
  return wgmma_trial_processes(executable, device, timeout_s);
}

WgmmaTrial wgmma_trial_processes(const std::string& executable, int device, double timeout_s) {
  // Shapes that differ only in a batch past 2 (training's and evaluation's) run the same trial:
  // one process each command.
  auto answers = std::make_shared<std::map<std::vector<std::string>, std::string>>();
  return [executable, device, timeout_s, answers](const AttentionShape& shape) {
    const std::vector<std::string> command = wgmma_trial_command(executable, device, shape);
    const auto known = answers->find(command);
    if (known != answers->end()) return known->second;
    return (*answers)[command] = run_wgmma_trial_process(executable, device, shape, timeout_s);
  };
}

std::vector<std::string> wgmma_trial_command(const std::string& executable, int device,
                                             const AttentionShape& shape) {
  return {executable,   "wgmma-trial",
          "--device",   std::to_string(device),
          "--batch",    std::to_string(std::min<int64_t>(shape.batch, 2)),
          "--seq",      std::to_string(shape.seq),
          "--heads",    std::to_string(shape.heads),
          "--kv-heads", std::to_string(shape.kv_heads),
          "--head-dim", std::to_string(shape.head_dim)};
}

std::string run_wgmma_trial_process(const std::string& executable, int device,
                                    const AttentionShape& shape, double timeout_s) {
  const std::vector<std::string> command = wgmma_trial_command(executable, device, shape);
  std::string command_text = "gnmr";
  for (size_t i = 1; i < command.size(); ++i) command_text += " " + command[i];
  const auto start = std::chrono::steady_clock::now();
  ChildOutcome outcome;
  try {
    outcome = run_child_process(command, timeout_s);
  } catch (const Error& e) {  // a process that cannot start cannot pass: the run goes on
    return "the wgmma trial process (" + command_text + ") did not start: " + e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (outcome.succeeded()) {
    spdlog::info(
        "the wgmma attention kernels passed their trial at {} in a process of their own "
        "({:.1f} s): auto times them beside mma.sync",
        attention_shape_text(shape), seconds);
    return "";
  }
  const std::string last_line = last_output_line(outcome.output);
  return "the wgmma trial process (" + command_text + ") " + child_ending_text(outcome, timeout_s) +
         (last_line.empty() ? "" : ": " + last_line);
}

std::string wgmma_trial_in_this_process(int device, const AttentionShape& shape) {
#ifdef GNMR_WITH_CUDA
  return flash_wgmma_trial(device, shape);
#else
  (void)device;
  (void)shape;
  throw Error(ErrorKind::NotBuilt,
              "wgmma-trial: the CUDA backend is not in this binary (built without nvcc)");
#endif
}

}  // namespace gnmr
