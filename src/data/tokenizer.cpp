#include "data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "util/error.h"

namespace gnmr {

Tokenizer Tokenizer::load(const std::string& model_path) {
  std::error_code ec;
  if (!std::filesystem::exists(model_path, ec)) {
    throw Error(ErrorKind::Data,
                "tokenizer " + model_path +
                    ": file not found (train one with `gnmr tokenizer train`, or "
                    "pass a sentencepiece .model such as data/brown/tokenizer.model)");
  }
  if (!std::filesystem::is_regular_file(model_path, ec)) {
    throw Error(ErrorKind::Data, "tokenizer " + model_path +
                                     ": not a file (a sentencepiece .model file is needed, such "
                                     "as data/brown/tokenizer.model)");
  }
  auto processor = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(model_path);
  if (!status.ok()) {
    throw Error(ErrorKind::Data, "tokenizer " + model_path + ": not a valid sentencepiece model (" +
                                     status.ToString() + ")");
  }
  Tokenizer tokenizer;
  tokenizer.processor_ = std::move(processor);
  tokenizer.model_path_ = model_path;
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) {
    throw Error(ErrorKind::Data,
                "tokenizer " + model_path_ + ": encode failed (" + status.ToString() + ")");
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int vocab = vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      throw Error(ErrorKind::Data, "tokenizer " + model_path_ + ": cannot decode id " +
                                       std::to_string(id) + " (vocab size " +
                                       std::to_string(vocab) + ")");
    }
  }
  std::string text;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) {
    throw Error(ErrorKind::Data,
                "tokenizer " + model_path_ + ": decode failed (" + status.ToString() + ")");
  }
  return text;
}

int Tokenizer::vocab_size() const {
  return processor_->GetPieceSize();
}
int Tokenizer::bos_id() const {
  return processor_->bos_id();
}
int Tokenizer::eos_id() const {
  return processor_->eos_id();
}

}  // namespace gnmr
