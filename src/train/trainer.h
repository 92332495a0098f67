// `gnmr train`: the run directory contract (docs/DESIGN.md §10), resume, periodic evaluation and
// checkpoints, metrics lines, and clean stops on SIGTERM/SIGUSR1 (SLURM pre-emption).
#pragma once

#include <cmath>
#include <string>

#include "config/config.h"

namespace gnmr {

struct TrainOptions {
  std::string out_dir;  // the run directory
  std::string resume;   // "" (fresh run), "auto" (newest checkpoint in out_dir) or a checkpoint dir
  bool force = false;   // replace a run directory that already holds a run
  std::string init;     // initialise weights from an HF folder or a gnmr checkpoint
  int64_t stop_at = 0;  // checkpoint and stop after this step, as a pre-emption would (0 = never)
  std::string build_id;  // the gnmr that trains, for the metrics header (cli/build_id.h)
};

struct TrainSummary {
  int64_t steps_done = 0;       // the step the run is at when it ends
  double final_loss = NAN;      // NAN: this job trained no step
  double final_val_loss = NAN;  // NAN: no evaluation ran (no data.val, or a stop before one)
  bool stopped_by_signal = false;
  int stop_signal = 0;  // a stop signal this process got while it trained (0: none)
};

TrainSummary run_training(const RunConfig& config, const TrainOptions& options);

}  // namespace gnmr
