#include "train/data_checks.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "data/prepare.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace gnmr {

int check_tokenizer(const DataConfig& data, const ModelConfig& model, bool warn) {
  if (data.tokenizer.empty()) {
    if (warn) spdlog::warn("data.tokenizer is not set: checkpoints will hold no tokenizer.model");
    return 0;
  }
  try {
    const Tokenizer tokenizer = Tokenizer::load(data.tokenizer);
    if (tokenizer.vocab_size() > model.vocab_size) {
      throw Error(ErrorKind::Data,
                  "tokenizer " + data.tokenizer + " has " + std::to_string(tokenizer.vocab_size()) +
                      " pieces, more than model.vocab_size (" + std::to_string(model.vocab_size) +
                      "); use the tokenizer the shards were made with, or raise model.vocab_size");
    }
    return tokenizer.vocab_size();
  } catch (const Error& e) {
    throw Error(e.kind(), std::string("data.tokenizer: ") + e.what());
  }
}

void check_shards_match(const DataConfig& data, int tokenizer_pieces, const TokenLoader& train,
                        const TokenLoader* val) {
  auto check = [&](const char* field, const std::string& glob, const TokenLoader& loader) {
    if (tokenizer_pieces > 0 && loader.shard_vocab_size() != tokenizer_pieces) {
      throw Error(ErrorKind::Data, std::string(field) + ": shards " + glob +
                                       " were made with a tokenizer of " +
                                       std::to_string(loader.shard_vocab_size()) +
                                       " pieces (their header), but " + "data.tokenizer " +
                                       data.tokenizer + " has " + std::to_string(tokenizer_pieces) +
                                       "; name the tokenizer the shards were made with");
    }
  };
  check("data.train", data.train, train);
  if (val == nullptr) return;
  check("data.val", data.val, *val);
  if (val->shard_vocab_size() != train.shard_vocab_size()) {
    throw Error(ErrorKind::Data, "data.val: shards " + data.val +
                                     " were made with a tokenizer of " +
                                     std::to_string(val->shard_vocab_size()) +
                                     " pieces (their header), data.train's " + data.train +
                                     " with one of " + std::to_string(train.shard_vocab_size()) +
                                     "; prepare both with the same tokenizer");
  }
}

int accumulation_steps_for(const RunConfig& config, int world_size) {
  const int64_t tokens_per_micro_step =
      int64_t(config.train.micro_batch) * config.data.seq_len * world_size;
  if (config.train.global_batch_tokens % tokens_per_micro_step != 0) {
    throw Error(ErrorKind::Config,
                "config: \"train.global_batch_tokens\" (" +
                    std::to_string(config.train.global_batch_tokens) +
                    ") must be a multiple of train.micro_batch × data.seq_len × ranks (" +
                    std::to_string(tokens_per_micro_step) + " with " + std::to_string(world_size) +
                    " ranks)");
  }
  return int(config.train.global_batch_tokens / tokens_per_micro_step);
}

int64_t eval_batch_count(const RunConfig& config, const TokenLoader& val, int64_t token_budget) {
  const int micro_batch = config.train.micro_batch;
  const int64_t batch_tokens = int64_t(micro_batch) * config.data.seq_len;
  // Whole batches only: the model's shapes are fixed at construction.
  if (token_budget < batch_tokens) {
    throw Error(ErrorKind::Config, "eval.tokens " + std::to_string(token_budget) +
                                       " is less than one evaluation batch of " +
                                       std::to_string(batch_tokens) +
                                       " tokens (train.micro_batch x data.seq_len); raise it to "
                                       "at least " +
                                       std::to_string(batch_tokens));
  }
  const int64_t windows = val.num_eval_windows();
  if (windows < micro_batch) {
    throw Error(
        ErrorKind::Data,
        "data.val: validation shards " + config.data.val + " hold " + std::to_string(windows) +
            " windows of data.seq_len + 1 = " + std::to_string(config.data.seq_len + 1) +
            " tokens, fewer than one batch (train.micro_batch = " + std::to_string(micro_batch) +
            ")");
  }
  return std::min(token_budget / batch_tokens, windows / micro_batch);
}

double epochs_read(const RunConfig& config, const TokenLoader& train) {
  const int64_t run_windows =
      config.train.steps * (config.train.global_batch_tokens / config.data.seq_len);
  return double(run_windows) / double(train.num_epoch_windows());
}

TrainingData open_training_data(const RunConfig& config, int rank, int world_size,
                                int accumulation_steps) {
  if (config.data.train.empty()) {
    throw Error(ErrorKind::Config, "config: \"data.train\" is not set");
  }
  const int seq_len = config.data.seq_len;
  const int tokenizer_pieces = check_tokenizer(config.data, config.model, rank == 0);
  // Loader errors name the shard or glob; prefix the config field they came from.
  auto open_loader = [&](const char* field, const std::string& glob, const std::string& sampling) {
    try {
      return std::make_unique<TokenLoader>(glob, seq_len, config.model.vocab_size, sampling,
                                           config.train.seed, rank, world_size, accumulation_steps);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string(field) + ": " + e.what());
    }
  };
  TrainingData data;
  data.train = open_loader("data.train", config.data.train, config.data.sampling);
  // How much of the data the run reads. (Rank 0's line speaks for the job.)
  const int64_t run_windows = config.train.steps * (config.train.global_batch_tokens / seq_len);
  spdlog::log(rank == 0 ? spdlog::level::info : spdlog::level::debug,
              "data.train: {} tokens, {} windows of {} tokens; {} steps read {} windows, {:.3g} "
              "epoch(s), data.sampling = {}{}",
              data.train->total_tokens(), data.train->num_epoch_windows(), seq_len + 1,
              config.train.steps, run_windows, epochs_read(config, *data.train),
              config.data.sampling,
              config.data.sampling == "random" ? " (drawn with replacement)" : "");
  if (!config.data.val.empty()) {
    data.val = open_loader("data.val", config.data.val, "sequential");
  }
  check_shards_match(config.data, tokenizer_pieces, *data.train, data.val.get());
  check_prepared_shards("data.train", data.train->shard_paths(), rank == 0);
  if (data.val) check_prepared_shards("data.val", data.val->shard_paths(), rank == 0);
  // The evaluation at the last step would fail after all the training: fail before it.
  if (data.val) eval_batch_count(config, *data.val, config.eval.tokens);
  return data;
}

}  // namespace gnmr
