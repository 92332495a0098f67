#include "train/preflight.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/data_checks.h"
#include "train/hf_format.h"
#include "train/run_controller.h"
#include "train/run_dir.h"
#include "util/directory_lock.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace gnmr {

namespace {

// "21.8 GB", or "5.0 MB" below a gigabyte (a small model's state is not "0.0 GB").
std::string size_text(double bytes) {
  if (bytes < 1e9) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.1f} GB", bytes / 1e9);
}

}  // namespace

void run_preflight(const RunConfig& config, const TrainOptions& options, int world_size) {
  if (world_size < 1) throw Error(ErrorKind::Usage, "--world-size must be at least 1");
  const int accumulation = accumulation_steps_for(config, world_size);
  // The controller as every rank makes it (restored below from the checkpoint a resume reads).
  const std::unique_ptr<Controller> controller =
      make_run_controller(config, world_size, SettingsWarnings::kAll);
  const TrainingData data = open_training_data(config, 0, world_size, accumulation);

  // The run directory as rank 0 would find it: in use by a job, a run to refuse or resume.
  std::error_code ec;
  // (The probe's lock goes at once; its lock file stays, as every run's does: removing it could
  // let a job that opened it meanwhile and a later one both hold a lock.)
  if (fs::is_directory(options.out_dir, ec)) {
    DirectoryLock probe(options.out_dir, "run directory", ErrorKind::Checkpoint);
  }
  const RunDirPlan plan = plan_run_dir(options);
  std::string start = "a fresh run in " + options.out_dir;
  if (!plan.resume_from.empty()) {
    check_checkpoint_model(plan.resume_from, config);
    load_controller_state(*controller, read_controller_state(plan.resume_from), plan.resume_from);
    start = "resumes from " + plan.resume_from;
  } else if (!options.init.empty()) {
    if (!is_hf_model_dir(options.init)) verify_checkpoint(options.init, CheckpointUse::Weights);
    check_init_source(options.init, config);
    start += ", weights from " + options.init;
  }
  if (!plan.note.empty()) start += " (" + plan.note + ")";

  const int64_t params = llama_parameter_count(config.model);
  const double state_bytes = 16.0 * double(params);  // fp32 weights, gradients, two moments
  const double zero_bytes = 8.0 * double(params) + 8.0 * double(params) / world_size;
  std::cout << "gnmr train --check: the job would start (" << world_size << " rank(s), backend "
            << config.backend << ")\n"
            << "  run directory: " << start << "\n"
            << "  model " << config.model.name << ": " << params << " parameters; per rank "
            << size_text(state_bytes) << " of fp32 weights, gradients and AdamW moments"
            << (world_size > 1
                    ? (config.dist.zero == 1 ? " before dist.zero=1, " : " (dist.zero=1: ") +
                          size_text(zero_bytes) + (config.dist.zero == 1 ? " with it" : ")")
                    : std::string())
            << "; activations and the backend's own memory not counted (gnmr bench measures "
               "them)\n"
            << "  batch: " << config.train.global_batch_tokens
            << " tokens a step = " << accumulation << " micro-step(s) of "
            << config.train.micro_batch << " x " << config.data.seq_len << " tokens on each of "
            << world_size << " rank(s)\n"
            << "  data.train: " << data.train->total_tokens() << " tokens; " << config.train.steps
            << " steps read " << fmt::format("{:.3g}", epochs_read(config, *data.train))
            << " epoch(s) (data.sampling = " << config.data.sampling << ")\n"
            << "  checkpoints: "
            << (config.checkpoint.every > 0
                    ? "every " + std::to_string(config.checkpoint.every) + " steps, "
                    : std::string("only at the end (checkpoint.every = 0), "))
            << "the newest " << config.checkpoint.keep << " kept\n"
            << "  not checked: the backend (a GPU, its memory) and the ranks' launch\n";
}

}  // namespace gnmr
