#include "train/run_dir.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer_state.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace gnmr {

namespace {

// The files a run writes at its top level (checkpoints/ aside).
constexpr const char* kRunFiles[] = {"metrics.jsonl", "config.json", "log.txt", "gnmr_summary.json",
                                     "gnmr_trace.jsonl"};
// What a run that never reached a checkpoint leaves behind, except log.txt and config.json.
constexpr const char* kProgressFiles[] = {"metrics.jsonl", "gnmr_summary.json", "gnmr_trace.jsonl"};

bool holds_a_run(const fs::path& dir) {
  return fs::exists(dir / "config.json") || fs::exists(dir / "metrics.jsonl") ||
         fs::exists(dir / "checkpoints");
}

// A gnmr run's config.json is a resolved config: an object with a model and a train section.
bool has_gnmr_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  auto config =
      nlohmann::json::parse(read_file(path.string()), nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.contains("model") && config.contains("train");
}

// --resume CKPT into --out that holds a run: CKPT must be one of that run's own checkpoints
// (going back, e.g. to lower the lr after a loss spike). The run's checkpoints after CKPT's step
// and its progress files as they are go to an abandoned_* folder, so nothing of the run it goes
// back from is lost, and neither --resume auto nor a re-reached step can take an old one for the
// new run's.
void plan_going_back(const fs::path& dir, const std::string& checkpoint, RunDirPlan& plan) {
  std::error_code ec;
  const fs::path own_checkpoints = fs::weakly_canonical(dir / "checkpoints", ec);
  const fs::path parent = fs::weakly_canonical(checkpoint, ec).parent_path();
  if (!fs::is_directory(dir / "checkpoints") || parent != own_checkpoints) {
    throw Error(ErrorKind::Checkpoint,
                "run directory " + dir.string() + " already holds a run, and --resume " +
                    checkpoint +
                    " is not one of its checkpoints; continue from another run's checkpoint "
                    "into a new --out (this run continues with --resume auto, or goes back with "
                    "--resume " +
                    (dir / "checkpoints" / "step_N").string() + ")");
  }
  const fs::path trainer_json = fs::path(checkpoint) / "trainer.json";
  const int64_t step =
      trainer_state_from_json(read_file(trainer_json.string()), trainer_json.string()).step;
  // step_NNNNNNNN and what is named after one (checkpoint consolidate's step_N_consolidated).
  for (const auto& entry : fs::directory_iterator(dir / "checkpoints")) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.substr(0, 13);
    if (digits.size() < 13 || digits.rfind("step_", 0) != 0 ||
        digits.find_first_not_of("0123456789", 5) != std::string::npos) {
      continue;
    }
    if (std::stoll(digits.substr(5)) > step) plan.abandoned_checkpoints.push_back(name);
  }
  std::sort(plan.abandoned_checkpoints.begin(), plan.abandoned_checkpoints.end());
  if (plan.abandoned_checkpoints.empty()) return;
  std::string name = "abandoned_after_step_" + std::to_string(step);
  for (int n = 2; fs::exists(dir / name); ++n) {
    name = "abandoned_after_step_" + std::to_string(step) + "_" + std::to_string(n);
  }
  plan.abandoned_dir = (dir / name).string();
  std::string moved;
  for (const auto& later : plan.abandoned_checkpoints) moved += (moved.empty() ? "" : ", ") + later;
  plan.note = "--resume " + checkpoint + ": going back to step " + std::to_string(step) +
              "; the run's later checkpoints (" + moved +
              ") and copies of its metrics, log, config and controller files as they were are "
              "kept in " +
              plan.abandoned_dir;
}

}  // namespace

RunDirPlan plan_run_dir(const TrainOptions& options) {
  RunDirPlan plan;
  plan.dir = options.out_dir;
  const fs::path dir = options.out_dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw Error(ErrorKind::Checkpoint,
                "--out " + dir.string() + " is a file, not a run directory; choose another --out");
  }
  if (!options.resume.empty()) {
    if (options.force) throw Error(ErrorKind::Usage, "--resume and --force cannot be combined");
    if (options.resume != "auto") {
      if (!options.init.empty()) {
        throw Error(ErrorKind::Usage, "--init and --resume " + options.resume +
                                          " cannot be combined: a resumed run takes its weights "
                                          "from the checkpoint");
      }
      if (!fs::is_directory(options.resume, ec)) {
        throw Error(ErrorKind::Checkpoint,
                    "--resume " + options.resume + " is not a gnmr checkpoint directory");
      }
      verify_checkpoint(options.resume);  // names a missing or damaged file
      plan.resume_from = options.resume;
      if (holds_a_run(dir)) plan_going_back(dir, options.resume, plan);
      return plan;
    }
    plan.resume_from = newest_intact_checkpoint(dir.string(), plan.skipped_checkpoints);
    if (!plan.resume_from.empty()) return plan;
    if (!holds_a_run(dir)) {
      plan.note = "--resume auto: no run in " + dir.string() + " yet, starting a fresh one";
      return plan;
    }
    if (!has_gnmr_config(dir)) {
      throw Error(ErrorKind::Checkpoint,
                  "--resume auto: " + dir.string() +
                      " has no gnmr config.json, so it does not hold a gnmr run; choose another "
                      "--out, or pass --force (without --resume) to replace what is there");
    }
    // Killed before its first checkpoint: nothing to continue from, so the run starts over,
    // as a requeued job (SLURM --requeue with --resume auto) expects.
    plan.start_over = true;
    plan.note = "--resume auto: " + dir.string() +
                " holds a run that never reached a checkpoint; starting it over from step 0 "
                "(its metrics.jsonl is cleared)";
    return plan;
  }
  if (holds_a_run(dir)) {
    if (!options.force) {
      throw Error(
          ErrorKind::Checkpoint,
          "run directory " + dir.string() +
              " already holds a run; pass --resume auto to continue it or --force to replace it");
    }
    plan.remove_run = true;
  }
  return plan;
}

void apply_run_dir_plan(const RunDirPlan& plan) {
  const fs::path dir = plan.dir;
  if (!plan.abandoned_dir.empty()) {
    const fs::path abandoned = plan.abandoned_dir;
    std::vector<std::string> moved;
    try {
      fs::create_directories(abandoned / "checkpoints");
      for (const char* file : kRunFiles) {
        if (fs::exists(dir / file)) fs::copy_file(dir / file, abandoned / file);
      }
      for (const auto& name : plan.abandoned_checkpoints) {
        fs::rename(dir / "checkpoints" / name, abandoned / "checkpoints" / name);
        moved.push_back(name);
      }
    } catch (const fs::filesystem_error& e) {
      // Undone (a full disk while copying the top-level files): the run stays as it was, with
      // no half-filled abandoned_after_step_S/ for the next go-back to number past.
      std::error_code ec;
      for (const auto& name : moved) {
        fs::rename(abandoned / "checkpoints" / name, dir / "checkpoints" / name, ec);
      }
      if (!ec) fs::remove_all(abandoned, ec);
      throw Error(ErrorKind::Runtime, "--resume: cannot keep the run's later checkpoints in " +
                                          abandoned.string() + " (" + e.code().message() + ": " +
                                          e.what() + "); the run directory was left as it was");
    }
  }
  if (plan.remove_run) {
    fs::remove_all(dir / "checkpoints");
    for (const char* file : kRunFiles) fs::remove(dir / file);
  }
  if (plan.start_over) {
    for (const char* file : kProgressFiles) fs::remove(dir / file);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw Error(ErrorKind::Checkpoint, "--out " + dir.string() +
                                           ": cannot create the run directory (" + ec.message() +
                                           "); choose another --out");
  }
}

}  // namespace gnmr
