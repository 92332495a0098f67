// The checks a run makes of its data before the first step: the tokenizer it names, and the
// shards it trains and evaluates on against that tokenizer and each other. Each failure is an
// Error(ErrorKind::Data) naming the config field and the file or glob.
#pragma once

#include <memory>

#include "config/config.h"
#include "data/loader.h"

namespace gnmr {

// data.tokenizer is copied into every checkpoint, so it is loaded before the first step. It
// may have fewer pieces than model.vocab_size (a vocabulary padded to a round size, as
// LLaMA-style models do, leaves the extra embedding rows unused), never more: the model could
// not embed the extra ids. Returns its piece count; 0 when data.tokenizer is not set (a
// warning where `warn`: one rank of a job says it).
int check_tokenizer(const DataConfig& data, const ModelConfig& model, bool warn);

// The shards' headers carry the piece count of the tokenizer that made them. A different
// count is a different tokenizer: its ids mean other words, and the checkpoints would carry a
// tokenizer.model that decodes them wrongly. TOKENIZER_PIECES is check_tokenizer's (0: no
// tokenizer, then train and val must still agree); VAL may be null (no data.val).
void check_shards_match(const DataConfig& data, int tokenizer_pieces, const TokenLoader& train,
                        const TokenLoader* val);

// Gradient-accumulation micro-steps per optimizer step for WORLD_SIZE ranks: an
// Error(ErrorKind::Config) naming the numbers when train.global_batch_tokens is not a multiple
// of train.micro_batch × data.seq_len × ranks.
int accumulation_steps_for(const RunConfig& config, int world_size);

// The evaluation batches of TOKEN_BUDGET on VAL: whole batches of train.micro_batch windows,
// at most what VAL holds. A budget under one batch is an Error(Config), a validation set under
// one batch an Error(Data).
int64_t eval_batch_count(const RunConfig& config, const TokenLoader& val, int64_t token_budget);

// The epochs of TRAIN (windows at stride data.seq_len) that train.steps optimizer steps read.
double epochs_read(const RunConfig& config, const TokenLoader& train);

// data.train and data.val (null when not set) as RANK of WORLD_SIZE reads them, with every
// check above, the shards' prepare.json and the evaluation budget made, and a log line saying
// how many epochs of the data the run's steps read.
struct TrainingData {
  std::unique_ptr<TokenLoader> train;
  std::unique_ptr<TokenLoader> val;
};
TrainingData open_training_data(const RunConfig& config, int rank, int world_size,
                                int accumulation_steps);

}  // namespace gnmr
