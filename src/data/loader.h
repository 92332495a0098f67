// TokenLoader: training batches and evaluation windows from memory-mapped token shards.
//
// A window is seq_len + 1 consecutive tokens of one shard (windows never cross shards):
// inputs are its first seq_len tokens, targets its last seq_len. Every batch is a pure
// function of (seed, rank, world_size, step, micro_step, row) — no hidden RNG state — so a
// run resumed at step S sees exactly the batches the original run saw from step S on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"

namespace gnmr {

enum class Sampling { Random, Sequential, Shuffled };

// "random" | "sequential" | "shuffled"; anything else is an Error(ErrorKind::Config).
Sampling parse_sampling(const std::string& name);

class TokenLoader {
 public:
  // shard_glob: e.g. "data/out/train_*.bin" (no match is an Error(ErrorKind::Data) naming it).
  // vocab_size: the model's; a shard whose header says more (ids the model cannot embed) is an
  // Error naming both; fewer is a padded model vocabulary, and fine. Every shard of the glob
  // must carry the same vocab size in its header (else an Error naming two of them).
  // sampling:   "random" — each row is an independent uniformly random window (ranks hash
  //                        their own rank in, so they draw disjoint data in expectation);
  //                        A window may repeat before another has been read once.
  //             "sequential" — windows at stride seq_len in order, global row r of the run
  //                        going to rank r % world_size, wrapping around at the end (epochs).
  //             "shuffled" — the same windows and row numbering, read in a new pseudo-random
  //                        order every epoch (data/window_permutation.h): each window once per
  //                        epoch, ranks disjoint, and the windows of a step the same for any
  //                        world size (a step's global rows are the same whatever the split).
  // micro_steps_per_step: gradient-accumulation steps per optimizer step; sequential and
  //             shuffled sampling need it to number rows without gaps or repeats.
  TokenLoader(const std::string& shard_glob, int seq_len, int vocab_size,
              const std::string& sampling, uint64_t seed, int rank, int world_size,
              int micro_steps_per_step = 1);

  // tokens, targets: [micro_batch, seq_len] row-major int32. micro_batch must be the same
  // on every call of a run (sequential sampling numbers rows by it).
  void next_batch_at(int64_t step, int micro_step, int micro_batch, int32_t* tokens,
                     int32_t* targets) const;

  // Evaluation: consecutive windows at stride seq_len, in order, shard after shard, so
  // their target spans are disjoint and cover each shard (bar a last partial window).
  int64_t num_eval_windows() const { return num_strided_windows_; }
  void eval_window(int64_t index, int32_t* tokens, int32_t* targets) const;

  int64_t total_tokens() const { return total_tokens_; }
  // Windows of one epoch of sequential or shuffled sampling (seq_len + 1 tokens at stride
  // seq_len): what a run reads once per epoch.
  int64_t num_epoch_windows() const { return num_strided_windows_; }
  // The vocab size in the shards' headers: the piece count of the tokenizer that made them.
  int shard_vocab_size() const { return shard_vocab_size_; }
  int seq_len() const { return seq_len_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }

 private:
  // Copies the window starting at START of shard SHARD into one row of tokens/targets.
  void copy_window(size_t shard, int64_t start, int32_t* tokens, int32_t* targets) const;
  void strided_window(int64_t index, int32_t* tokens, int32_t* targets) const;

  int seq_len_;
  Sampling sampling_;
  uint64_t seed_;
  int rank_;
  int world_size_;
  int micro_steps_per_step_;
  std::vector<std::string> shard_paths_;
  std::vector<ShardReader> shards_;
  // Prefix sums over shards: random window starts (tokens - seq_len per shard) and
  // strided windows ((tokens - 1) / seq_len per shard).
  std::vector<int64_t> random_starts_prefix_;
  std::vector<int64_t> strided_windows_prefix_;
  int64_t num_random_starts_ = 0;
  int64_t num_strided_windows_ = 0;
  int64_t total_tokens_ = 0;
  int shard_vocab_size_ = 0;
};

}  // namespace gnmr
