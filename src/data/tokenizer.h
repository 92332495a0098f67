// The tokenizer: a thin wrapper over a sentencepiece model, plus training a new one.
// Any sentencepiece model works where a tokenizer is taken — the bundled
// data/brown/tokenizer.model, or LLaMA-2's 32000-piece tokenizer.model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace gnmr {

class Tokenizer {
 public:
  // Throws Error(ErrorKind::Data) naming MODEL_PATH if it is missing or not a model.
  static Tokenizer load(const std::string& model_path);

  // Thread-safe: prepare's workers share one Tokenizer. No BOS/EOS is added.
  std::vector<int32_t> encode(const std::string& text) const;

  // encode()'s ids for a document of any length, in memory that grows with PIECE_BYTES (or
  // the longest stretch without a cut point) rather than the document's size: sentencepiece
  // takes many times the size of the text it encodes, and time that grows faster than it.
  // Text longer than PIECE_BYTES is cut at single spaces between two printable ASCII
  // characters and encoded a piece at a time, where cuts_at_spaces_exactly(). Text without
  // such a space, or a tokenizer where cutting could change the ids, is encoded whole.
  static constexpr size_t kDocumentPieceBytes = 1 << 16;
  std::vector<int32_t> encode_document(const std::string& text,
                                       size_t piece_bytes = kDocumentPieceBytes) const;

  // Whether "...x y..." encodes as "...x" followed by "y..." where x and y are printable ASCII
  // characters other than the space: the model turns a text's start into the "▁" a space
  // becomes (a dummy prefix), and none of its pieces joins a "▁" onto a character before it,
  // so no merge crosses such a space (whitespace-only pieces, "▁▁", need a "▁" or a space
  // beside it, which x and y are not; normalization leaves printable ASCII as it is). Checked
  // at load(), on the vocabulary and on probe texts; true for `gnmr tokenizer train`'s models.
  bool cuts_at_spaces_exactly() const { return cuts_at_spaces_exactly_; }
  std::string decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const;
  int bos_id() const;               // -1 when the model has no BOS piece
  int eos_id() const;               // -1 when the model has no EOS piece
  int unk_id() const;               // -1 when the model has no UNK piece
  std::string piece(int id) const;  // the piece's text, e.g. "<s>"; id in [0, vocab_size())
  const std::string& model_path() const { return model_path_; }

 private:
  Tokenizer() = default;  // only load() makes one, so a Tokenizer always holds a model

  std::shared_ptr<const sentencepiece::SentencePieceProcessor> processor_;
  std::string model_path_;
  bool cuts_at_spaces_exactly_ = false;
};

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // .txt, .jsonl ("text" field), or .gz of either
  int vocab_size = 0;
  std::string out_prefix;  // writes OUT_PREFIX.model and OUT_PREFIX.vocab
  int threads = 0;         // 0 = hardware concurrency
  // sentencepiece holds its training sentences in memory; beyond this many lines it keeps a
  // uniform random sample (reservoir sampling, fixed seed so training is reproducible).
  int64_t max_sentences = 10'000'000;
};

// Trains a BPE sentencepiece model with LLaMA-2's options (byte fallback, split digits,
// identity normalization, unk=0 bos=1 eos=2, no pad). Throws Error(ErrorKind::Data) for a
// missing or unreadable input, or a vocab size the corpus cannot fill.
void train_tokenizer(const TokenizerTrainOptions& options);

}  // namespace gnmr
