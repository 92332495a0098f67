#include "data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "util/error.h"

namespace gnmr {

namespace {

// A printable ASCII character other than the space: no normalization changes it or joins it
// to the space beside it, and it is not "▁" (U+2581), which the model's whitespace-only pieces
// ("▁▁") could join to the space's "▁".
bool is_plain_character(char c) {
  return c > ' ' && c < 0x7F;
}

// A single space between two plain characters: where encode_document may cut.
bool is_cut_point(const std::string& text, size_t i) {
  return text[i] == ' ' && i > 0 && i + 1 < text.size() && is_plain_character(text[i - 1]) &&
         is_plain_character(text[i + 1]);
}

// Tokenizer::cuts_at_spaces_exactly's check.
bool check_cuts_at_spaces(const sentencepiece::SentencePieceProcessor& processor) {
  const std::string space = "\xE2\x96\x81";  // U+2581, what sentencepiece makes of a space
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    const std::string& piece = processor.IdToPiece(id);
    size_t lead = 0;
    while (piece.compare(lead, space.size(), space) == 0) lead += space.size();
    if (piece.find(space, lead) != std::string::npos) return false;  // joins "x▁"
  }
  const char* probes[] = {"hello world", "a b", "The river, 1987 naive cafe\xC3\xA9 42.5%",
                          "tokens \xE2\x80\x94 x"};
  for (const char* probe : probes) {
    const std::string text = probe;
    std::vector<int> whole, cut, part;
    if (!processor.Encode(text, &whole).ok()) return false;
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
      if (i < text.size() && !is_cut_point(text, i)) continue;
      if (!processor.Encode(text.substr(start, i - start), &part).ok()) return false;
      cut.insert(cut.end(), part.begin(), part.end());
      start = i + 1;
    }
    if (cut != whole) return false;
  }
  return true;
}

}  // namespace

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
  tokenizer.cuts_at_spaces_exactly_ = check_cuts_at_spaces(*processor);
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

std::vector<int32_t> Tokenizer::encode_document(const std::string& text, size_t piece_bytes) const {
  if (text.size() <= piece_bytes || !cuts_at_spaces_exactly_) return encode(text);
  std::vector<int32_t> ids;
  size_t start = 0;
  while (text.size() - start > piece_bytes) {
    // The last cut point within PIECE_BYTES of START, else the first after it.
    size_t cut = start + piece_bytes;
    while (cut > start && !is_cut_point(text, cut)) --cut;
    if (cut == start) {
      cut = start + piece_bytes;
      while (cut < text.size() && !is_cut_point(text, cut)) ++cut;
      if (cut == text.size()) break;
    }
    const std::vector<int32_t> piece = encode(text.substr(start, cut - start));
    ids.insert(ids.end(), piece.begin(), piece.end());
    start = cut + 1;  // the space is the next piece's dummy prefix
  }
  const std::vector<int32_t> rest = encode(text.substr(start));
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
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
int Tokenizer::unk_id() const {
  return processor_->unk_id();
}
std::string Tokenizer::piece(int id) const {
  return processor_->IdToPiece(id);
}

}  // namespace gnmr
