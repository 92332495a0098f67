#include "train/data_checks.h"

#include <spdlog/spdlog.h>

#include "data/tokenizer.h"
#include "util/error.h"

namespace gnmr {

int check_tokenizer(const DataConfig& data, const ModelConfig& model) {
  if (data.tokenizer.empty()) {
    spdlog::warn("data.tokenizer is not set: checkpoints will hold no tokenizer.model");
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

}  // namespace gnmr
