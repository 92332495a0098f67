// The run directory contract of `gnmr train` (README "gnmr train"): what --out, --resume and
// --force mean for a directory. Deciding reads the directory and changes nothing, so a refused
// run (a bad --resume, a checkpoint of another model, an unreadable --init) leaves config.json,
// log.txt and metrics.jsonl exactly as they were; the trainer applies the plan only once the
// checkpoint or initial weights have loaded.
//
//   no run in --out                     fresh run (a directory without config.json,
//                                       metrics.jsonl or checkpoints/ holds no run)
//   a run, no flag                      refused: --resume auto or --force
//   a run, --force                      its files are removed, fresh run
//   a run, --resume auto                continue from its newest intact checkpoint (damaged newer
//                                       ones are skipped and named in the log); with none
//                                       yet (killed before the first), the run starts over:
//                                       metrics.jsonl and the traces are removed, log.txt keeps
//                                       its lines and says so
//   --resume CKPT_DIR                   continue from that checkpoint (refused if damaged);
//                                       into a run, only from one of its own checkpoints: its
//                                       later checkpoints move, and its top-level files are
//                                       copied, to --out/abandoned_after_step_S[_N]/ first
//   --out names a file                  refused (exit code 5)
#pragma once

#include <string>
#include <vector>

#include "train/trainer.h"

namespace gnmr {

struct RunDirPlan {
  std::string dir;          // --out
  std::string resume_from;  // checkpoint directory to continue from; "" = start at step 0
  bool remove_run = false;  // --force: remove every file of the run already there
  bool start_over = false;  // --resume auto before the first checkpoint: remove its metrics
  std::string note;         // the decision, for the log once log.txt is open ("" = nothing)
  std::vector<std::string> skipped_checkpoints;  // damaged ones --resume auto passed over, why
  // --resume of an older checkpoint of --out's own run: where its later checkpoints (moved) and
  // top-level files (copied, before the resumed run cuts its metrics back) are kept.
  std::string abandoned_dir;
  std::vector<std::string> abandoned_checkpoints;  // step_N(_consolidated) after the resumed step
};

// Reads --out and decides; throws Error (Usage, or Checkpoint naming the directory and the
// fix) for a refused combination. Changes nothing on disk.
RunDirPlan plan_run_dir(const TrainOptions& options);

// Makes the directory what the plan says: removes what it says to remove and creates --out.
// Throws Error(ErrorKind::Checkpoint) when --out cannot be created.
void apply_run_dir_plan(const RunDirPlan& plan);

}  // namespace gnmr
