// Checkpoints (DESIGN §5): RUN_DIR/checkpoints/step_NNNNNNNN/ holding
//   model.safetensors      fp32 master weights under Hugging Face names
//   optimizer.safetensors  AdamW moments ("m.NAME", "v.NAME")
//   trainer.json           step, tokens seen, non-finite counters
//   controller.bin         GNMR controller state (opaque, versioned by the controller)
//   config.json            the resolved run config
//   tokenizer.model        copy of the tokenizer, so a checkpoint is self-contained
// Written to a temporary directory, fsync'd and renamed: a crash never damages the newest
// complete checkpoint. Resume from it is bit-exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/llama.h"
#include "train/optimizer.h"
#include "train/trainer_state.h"

namespace gnmr {

std::string checkpoint_dir_name(int64_t step);

// Writes the checkpoint for state.step and keeps only the newest `keep` ones.
std::string save_checkpoint(const std::string& run_dir, const RunConfig& config, Backend& backend,
                            const LlamaModel& model, AdamW& optimizer, const TrainerState& state);

// Newest complete checkpoint directory under RUN_DIR/checkpoints, or "" when none.
std::string find_latest_checkpoint(const std::string& run_dir);

// The resolved config stored in a checkpoint.
nlohmann::json read_checkpoint_config(const std::string& checkpoint_dir);

// Restores weights, moments and trainer state. The checkpoint's model section must equal
// the current config's (a Checkpoint error names the first differing field).
TrainerState load_checkpoint(const std::string& checkpoint_dir, const RunConfig& config, Backend& backend,
                             LlamaModel& model, AdamW& optimizer);

// Copies every parameter of the model to host fp32 buffers (one per parameter).
std::vector<std::vector<float>> model_weights_to_host(Backend& backend, const LlamaModel& model);

}  // namespace gnmr
