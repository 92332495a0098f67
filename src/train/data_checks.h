// The checks a run makes of its data before the first step: the tokenizer it names, and the
// shards it trains and evaluates on against that tokenizer and each other. Each failure is an
// Error(ErrorKind::Data) naming the config field and the file or glob.
#pragma once

#include "config/config.h"
#include "data/loader.h"

namespace gnmr {

// data.tokenizer is copied into every checkpoint, so it is loaded before the first step. It
// may have fewer pieces than model.vocab_size (a vocabulary padded to a round size, as
// LLaMA-style models do, leaves the extra embedding rows unused), never more: the model could
// not embed the extra ids. Returns its piece count; 0 when data.tokenizer is not set.
int check_tokenizer(const DataConfig& data, const ModelConfig& model);

// The shards' headers carry the piece count of the tokenizer that made them. A different
// count is a different tokenizer: its ids mean other words, and the checkpoints would carry a
// tokenizer.model that decodes them wrongly. TOKENIZER_PIECES is check_tokenizer's (0: no
// tokenizer, then train and val must still agree); VAL may be null (no data.val).
void check_shards_match(const DataConfig& data, int tokenizer_pieces, const TokenLoader& train,
                        const TokenLoader* val);

}  // namespace gnmr
