// trainer.json in a checkpoint: the trainer's counters, written and read back by
// save_checkpoint / load_checkpoint (checkpoint.h). The controller state travels beside it
// in controller.bin.
//   {"format": 1, "step": 200, "tokens_seen": 819200, "consecutive_nonfinite": 0,
//    "skipped_steps": 0, "world_size": 8,
//    "numerics": "cpu: OpenBLAS 0.3.21 kernel Cooperlake, GEMM rows split over 2 thread(s)",
//    "data": "3 shard(s), 1613527 tokens, files 0123456789abcdef"}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gnmr {

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  int64_t tokens_seen = 0;
  int consecutive_nonfinite = 0;
  int64_t skipped_steps = 0;
  // The ranks of the job that wrote it; 0 in checkpoints from before it was recorded.
  int64_t world_size = 0;
  // What besides the config and seed fixes the run's bits (the CPU's BLAS kernel and GEMM
  // thread count; the GPU): a resume under another one is correct but not bit-exact. "" in
  // checkpoints from before it was recorded.
  std::string numerics;
  // The training shards it read (TrainingSession::train_data_fingerprint); "" where not recorded.
  std::string data;
  std::vector<uint8_t> controller_state;
};

// The trainer.json record of STATE (without the controller state).
nlohmann::json trainer_state_to_json(const TrainerState& state);

// Parses the trainer.json TEXT read from PATH (controller_state left empty); a damaged or
// unsupported record is an Error(Checkpoint) naming PATH.
TrainerState trainer_state_from_json(const std::string& text, const std::string& path);

}  // namespace gnmr
