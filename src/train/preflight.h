// `gnmr train --check`: what a training job would refuse before its first step, found without
// building the model or starting a backend, so that a job is checked on a login node before it
// waits in a queue for GPUs: the config, the batch arithmetic for the job's world size, the
// controller (its options and warnings, the one-rank rule of recovery gaps), the tokenizer and
// shards (prepare.json, the evaluation budget), the run directory (a run already there, a lock
// held, the checkpoint --resume would take: intact, of this model, its controller state saved
// under these gnmr.* options), and --init's weights. It prints the plan: parameters and the bytes
// of weights, gradients and AdamW moments per rank, the batch split, how much of the data the run
// reads. Not checked: the backend (a GPU and its memory: `gnmr bench` on one GPU measures it) and
// the ranks' launch.
#pragma once

#include "config/config.h"
#include "train/trainer.h"

namespace gnmr {

// Throws the Error the job would stop with; prints the plan to stdout otherwise.
void run_preflight(const RunConfig& config, const TrainOptions& options, int world_size);

}  // namespace gnmr
