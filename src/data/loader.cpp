#include "data/loader.h"

#include <glob.h>

#include <algorithm>

#include "data/counter_hash.h"
#include "data/window_permutation.h"
#include "util/error.h"
#include "util/log.h"

namespace gnmr {

namespace {

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw Error(ErrorKind::Data, "shards \"" + pattern + "\": cannot expand the pattern");
  }
  if (paths.empty()) {
    throw Error(ErrorKind::Data, "shards \"" + pattern +
                                     "\": no file matches (run `gnmr prepare` first, or fix the "
                                     "path/glob)");
  }
  std::sort(paths.begin(), paths.end());  // glob sorts too; make the order explicit
  return paths;
}

// The shard holding global item INDEX, given exclusive prefix sums (prefix[0] = 0).
size_t shard_of(const std::vector<int64_t>& prefix, int64_t index) {
  auto it = std::upper_bound(prefix.begin(), prefix.end(), index);
  return static_cast<size_t>(it - prefix.begin()) - 1;
}

}  // namespace

Sampling parse_sampling(const std::string& name) {
  if (name == "random") return Sampling::Random;
  if (name == "sequential") return Sampling::Sequential;
  if (name == "shuffled") return Sampling::Shuffled;
  throw Error(ErrorKind::Config, "data sampling \"" + name +
                                     "\" is not one of \"random\", \"sequential\", \"shuffled\"");
}

TokenLoader::TokenLoader(const std::string& shard_glob, int seq_len, int vocab_size,
                         const std::string& sampling, uint64_t seed, int rank, int world_size,
                         int micro_steps_per_step)
    : seq_len_(seq_len),
      sampling_(parse_sampling(sampling)),
      seed_(seed),
      rank_(rank),
      world_size_(world_size),
      micro_steps_per_step_(micro_steps_per_step) {
  GNMR_CHECK(seq_len > 0, "loader seq_len must be positive");
  GNMR_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "loader rank outside world");
  GNMR_CHECK(micro_steps_per_step > 0, "loader micro_steps_per_step must be positive");

  shard_paths_ = expand_glob(shard_glob);
  random_starts_prefix_.push_back(0);
  strided_windows_prefix_.push_back(0);
  for (const auto& path : shard_paths_) {
    ShardReader shard(path);
    // A model's vocabulary may be padded above its tokenizer's (to a multiple of 64 or 128, as
    // GPU runs do), never below: the model could not embed the extra ids.
    if (shard.vocab_size() > vocab_size) {
      throw Error(ErrorKind::Data,
                  "shard " + path + ": vocab size " + std::to_string(shard.vocab_size()) +
                      " in its header is more than the model's vocab size " +
                      std::to_string(vocab_size) +
                      " (prepare the data with the model's tokenizer, or raise model.vocab_size)");
    }
    // Shards of one glob made with different tokenizers hold ids that mean different words.
    if (path != shard_paths_.front() && shard.vocab_size() != shard_vocab_size_) {
      throw Error(ErrorKind::Data, "shard " + path + ": vocab size " +
                                       std::to_string(shard.vocab_size()) +
                                       " in its header differs from " + shard_paths_.front() +
                                       "'s " + std::to_string(shard_vocab_size_) +
                                       ": the glob mixes shards made with different tokenizers");
    }
    shard_vocab_size_ = shard.vocab_size();
    const int64_t n = shard.token_count();
    total_tokens_ += n;
    num_random_starts_ += std::max<int64_t>(0, n - seq_len);
    num_strided_windows_ += n > 0 ? (n - 1) / seq_len : 0;
    random_starts_prefix_.push_back(num_random_starts_);
    strided_windows_prefix_.push_back(num_strided_windows_);
    shards_.push_back(std::move(shard));
  }
  if (num_random_starts_ == 0) {
    throw Error(ErrorKind::Data, "shards \"" + shard_glob + "\": no shard holds seq_len + 1 = " +
                                     std::to_string(seq_len + 1) + " tokens (" +
                                     std::to_string(total_tokens_) +
                                     " tokens in all); use more data or a shorter seq_len");
  }
  spdlog::debug("loader: {} shard(s), {} tokens, {} windows of {} from \"{}\"", shards_.size(),
                total_tokens_, num_strided_windows_, seq_len + 1, shard_glob);
}

void TokenLoader::copy_window(size_t shard, int64_t start, int32_t* tokens,
                              int32_t* targets) const {
  const ShardReader& reader = shards_[shard];
  reader.copy_tokens(start, seq_len_, tokens);
  reader.copy_tokens(start + 1, seq_len_, targets);
}

void TokenLoader::strided_window(int64_t index, int32_t* tokens, int32_t* targets) const {
  const size_t shard = shard_of(strided_windows_prefix_, index);
  const int64_t start = (index - strided_windows_prefix_[shard]) * seq_len_;
  copy_window(shard, start, tokens, targets);
}

void TokenLoader::next_batch_at(int64_t step, int micro_step, int micro_batch, int32_t* tokens,
                                int32_t* targets) const {
  GNMR_CHECK(step >= 0 && micro_batch > 0, "loader: negative step or empty micro-batch");
  GNMR_CHECK(micro_step >= 0 && micro_step < micro_steps_per_step_,
             "loader: micro_step " + std::to_string(micro_step) + " outside the " +
                 std::to_string(micro_steps_per_step_) + " micro-steps per step it was built for");
  for (int row = 0; row < micro_batch; ++row) {
    int32_t* row_tokens = tokens + static_cast<int64_t>(row) * seq_len_;
    int32_t* row_targets = targets + static_cast<int64_t>(row) * seq_len_;
    if (sampling_ == Sampling::Random) {
      const uint64_t h =
          hash_values({seed_, static_cast<uint64_t>(rank_), static_cast<uint64_t>(world_size_),
                       static_cast<uint64_t>(step), static_cast<uint64_t>(micro_step),
                       static_cast<uint64_t>(row)});
      // Modulo bias is below num_starts / 2^64: negligible for any real corpus.
      const int64_t start_index =
          static_cast<int64_t>(h % static_cast<uint64_t>(num_random_starts_));
      const size_t shard = shard_of(random_starts_prefix_, start_index);
      copy_window(shard, start_index - random_starts_prefix_[shard], row_tokens, row_targets);
    } else {
      // Rows of the whole run in order; rank r takes every world_size-th, so ranks stride;
      // shuffled reads each epoch's windows in its own order.
      const int64_t local_row =
          (step * micro_steps_per_step_ + micro_step) * static_cast<int64_t>(micro_batch) + row;
      const int64_t global_row = local_row * world_size_ + rank_;
      const int64_t epoch = global_row / num_strided_windows_;
      const int64_t index = global_row % num_strided_windows_;
      strided_window(
          sampling_ == Sampling::Shuffled
              ? permuted_window(seed_, static_cast<uint64_t>(epoch), index, num_strided_windows_)
              : index,
          row_tokens, row_targets);
    }
  }
}

void TokenLoader::eval_window(int64_t index, int32_t* tokens, int32_t* targets) const {
  GNMR_CHECK(index >= 0 && index < num_strided_windows_,
             "eval window " + std::to_string(index) + " outside [0, " +
                 std::to_string(num_strided_windows_) + ")");
  strided_window(index, tokens, targets);
}

}  // namespace gnmr
