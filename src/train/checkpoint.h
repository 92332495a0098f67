// Checkpoints (docs/DESIGN.md §5): RUN_DIR/checkpoints/step_NNNNNNNN/ holding
//   model.safetensors      fp32 master weights under Hugging Face names
//   optimizer.safetensors  AdamW moments ("m.NAME", "v.NAME"); with dist.zero=1 per-rank
//                          shards instead (train/zero_checkpoint.h)
//   trainer.json           step, tokens seen, non-finite counters, world size, numerics, data
//                          (train/trainer_state.h)
//   controller.bin         GNMR controller state (opaque, versioned by the controller)
//   config.json            the resolved run config
//   tokenizer.model        copy of the tokenizer, so a checkpoint is self-contained
//   manifest.json          size and CRC-32 of every file above (checkpoint_manifest.h)
// Written to checkpoints/.tmp_step_NNNNNNNN_<pid>, fsync'd and renamed: a crash never damages
// the newest complete checkpoint, and a failed write removes its temporary directory. Resume
// from it is bit-exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "train/optimizer.h"
#include "train/trainer_state.h"
#include "train/zero_optimizer.h"

namespace gnmr {

std::string checkpoint_dir_name(int64_t step);

// The steps of RUN_DIR/checkpoints/step_NNNNNNNN directories, ascending (unchecked).
std::vector<int64_t> checkpoint_steps(const std::string& run_dir);

// Writes the checkpoint for state.step and keeps only the newest `keep` ones.
std::string save_checkpoint(const std::string& run_dir, const RunConfig& config, Backend& backend,
                            const LlamaModel& model, AdamW& optimizer, const TrainerState& state);

// The same for dist.zero=1 (train/zero_checkpoint.h): a collective, every rank calls it;
// rank 0 writes the checkpoint and returns its directory, the others send their moment shards
// and return "".
std::string save_checkpoint(const std::string& run_dir, const RunConfig& config, Backend& backend,
                            const LlamaModel& model, ZeroAdamW& optimizer, Communicator& comm,
                            const TrainerState& state);

// Removes the temporary directories a failed or killed save left under RUN_DIR/checkpoints
// (only the writing rank, rank 0, calls it). RUN_DIR_LOCKED: it holds the run directory's lock,
// so every one is stale, whatever process its pid names now.
void remove_stale_checkpoint_temps(const std::string& run_dir, bool run_dir_locked);

// Newest checkpoint directory under RUN_DIR/checkpoints, or "" when none (unchecked).
std::string find_latest_checkpoint(const std::string& run_dir);

// `--resume auto`: the newest checkpoint that is complete and undamaged; each damaged newer
// one is skipped, with a line naming it and the reason appended to `skipped` (for the log).
// "" when there is no checkpoint; a Checkpoint error when there are some but none is intact.
std::string newest_intact_checkpoint(const std::string& run_dir, std::vector<std::string>& skipped);

// The resolved config stored in a checkpoint.
nlohmann::json read_checkpoint_config(const std::string& checkpoint_dir);

// A resume continues the same model: an Error(Checkpoint) naming the key where the model
// section of CHECKPOINT_DIR's config.json differs from `config`'s (its name and attention
// kernel aside).
void check_checkpoint_model(const std::string& checkpoint_dir, const RunConfig& config);

// The bytes of CHECKPOINT_DIR's controller.bin (the controller's state; run_controller.h
// restores it).
std::vector<uint8_t> read_controller_state(const std::string& checkpoint_dir);

// A Checkpoint error when DIR (a checkpoint or a model folder every rank reads) does not
// exist: on a rank other than the one that found it, the sign of a filesystem that is not
// shared between the nodes, which the message says.
void require_existing_model_dir(const std::string& dir);

// Restores weights, moments and trainer state. The checkpoint's model section must equal
// the current config's (a Checkpoint error names the first differing field). Callers check
// the checkpoint first (verify_checkpoint or newest_intact_checkpoint).
// A checkpoint with sharded (ZeRO-1) optimizer state is refused here, naming the fix.
TrainerState load_checkpoint(const std::string& checkpoint_dir, const RunConfig& config,
                             Backend& backend, LlamaModel& model, AdamW& optimizer);
// dist.zero=1: this rank's moment shard, from a sharded checkpoint of the same world size (a
// Checkpoint error names both sizes and `gnmr checkpoint consolidate` otherwise) or from a
// consolidated one of any world size.
TrainerState load_checkpoint(const std::string& checkpoint_dir, const RunConfig& config,
                             Backend& backend, LlamaModel& model, ZeroAdamW& optimizer);

// Copies every parameter of the model to host fp32 buffers (one per parameter).
std::vector<std::vector<float>> model_weights_to_host(Backend& backend, const LlamaModel& model);

}  // namespace gnmr
