// `gnmr train --config FILE [--set K=V]... [--out DIR] [--resume auto|CKPT] [--force]
//             [--backend cpu|cuda] [--steps N] [--init HF_DIR|CKPT] [--check [--world-size N]]`
#include <spdlog/spdlog.h>

#include <cmath>
#include <csignal>

#include "cli/build_id.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/path_flags.h"
#include "cli/validators.h"
#include "parallel/launch_env.h"
#include "train/preflight.h"
#include "train/trainer.h"
#include "util/stop_signals.h"

namespace gnmr {

CommandAction add_train_command(CLI::App& app) {
  auto flags = add_config_flags(app);
  auto options = std::make_shared<TrainOptions>();
  auto backend = std::make_shared<std::string>();
  auto steps = std::make_shared<int64_t>(0);
  auto check = std::make_shared<bool>(false);
  auto world_size = std::make_shared<int>(0);
  options->out_dir = "runs/latest";
  app.add_option("--out", options->out_dir,
                 "Run directory (config.json, log.txt, metrics.jsonl, checkpoints/)")
      ->capture_default_str();
  app.add_option("--resume", options->resume,
                 "Continue a run: 'auto' (newest intact checkpoint in --out; a run without one "
                 "starts over, an empty --out starts fresh) or a checkpoint dir")
      ->check(CLI::Validator(
          [](std::string& value) {
            // An unset shell variable (--resume "$CKPT") once started a fresh run silently.
            return value.empty() ? std::string(
                                       "must be 'auto' or a checkpoint directory (got "
                                       "an empty value)")
                                 : std::string();
          },
          "auto|CKPT_DIR"));
  app.add_flag("--force", options->force, "Replace a run directory that already holds a run");
  app.add_option("--backend", *backend, "cpu or cuda (overrides the config's backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--steps", *steps, "Number of optimizer steps (overrides train.steps)")
      ->check(at_least(1));
  app.add_option("--stop-at", options->stop_at,
                 "Checkpoint and stop after this step (the schedule still spans train.steps)")
      ->check(at_least(1));
  app.add_option("--init", options->init,
                 "Initialise weights from a Hugging Face LLaMA folder or a gnmr checkpoint");
  app.add_flag("--check", *check,
               "Check everything the job would refuse before its first step (config, batch "
               "split, tokenizer, shards, run directory, checkpoint) without a model or backend, "
               "print the plan, and exit");
  app.add_option("--world-size", *world_size,
                 "With --check: the job's ranks (default: the launcher's, else 1)")
      ->check(at_least(1));
  return [flags, options, backend, steps, check, world_size] {
    if (!options->init.empty()) require_directory("--init", options->init, ErrorKind::Checkpoint);
    ConfigFlags resolved = *flags;
    if (!backend->empty()) resolved.overrides.push_back("backend=\"" + *backend + "\"");
    if (*steps > 0) resolved.overrides.push_back("train.steps=" + std::to_string(*steps));
    RunConfig config = resolved.load();
    if (config.log.level != "info") spdlog::set_level(spdlog::level::from_str(config.log.level));
    if (*check) {
      release_stop_signals();  // no checkpoint to make: Ctrl-C ends a check at once
      run_preflight(config, *options, *world_size > 0 ? *world_size : read_launch_env().world_size);
      return;
    }
    if (*world_size > 0) throw Error(ErrorKind::Usage, "--world-size is for --check");
    // The run's first line (log.txt begins with the start-up lines): which gnmr this is, also
    // in a run refused during its set-up.
    options->build_id = gnmr_build_id();
    if (read_launch_env().rank == 0) spdlog::info("gnmr {}", options->build_id);
    TrainSummary summary = run_training(config, *options);
    std::string done = "done: " + std::to_string(summary.steps_done) + " steps";
    if (std::isfinite(summary.final_loss)) {
      done += fmt::format(", final loss {:.4f}", summary.final_loss);
    }
    if (std::isfinite(summary.final_val_loss)) {
      done += fmt::format(", final val loss {:.4f}", summary.final_val_loss);
    }
    spdlog::info("{}", done);
    // Stopped by Ctrl-C or a closed terminal: checkpointed; now end by that signal, as the
    // shell that sent it expects (a loop of trainings stops at Ctrl-C).
    if (summary.stop_signal == SIGINT || summary.stop_signal == SIGHUP) {
      std::signal(summary.stop_signal, SIG_DFL);
      std::raise(summary.stop_signal);
    }
  };
}

}  // namespace gnmr
