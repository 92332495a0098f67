// train_tokenizer (declared in tokenizer.h): sentencepiece BPE training with LLaMA-2's
// options, fed from our own document reader so .jsonl and .gz inputs work.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "data/document_reader.h"
#include "data/tokenizer.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/log.h"

namespace gnmr {

namespace {

// LLaMA-2's trainer_spec.max_sentence_length; sentencepiece skips longer lines, so we cut
// them at a space (or, failing that, a UTF-8 character boundary) instead.
constexpr size_t kMaxSentenceBytes = 4192;

// Yields the lines of every document of every input, in order, each at most
// kMaxSentenceBytes long. Errors are kept and reported through status(), since they
// surface inside sentencepiece's training loop.
class CorpusSentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit CorpusSentenceIterator(const std::vector<std::string>& inputs) : inputs_(inputs) {
    Next();
  }

  bool done() const override { return done_; }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override {
    if (error_)
      return sentencepiece::util::Status(sentencepiece::util::StatusCode::kDataLoss,
                                         "reading the corpus failed");
    return sentencepiece::util::Status();
  }
  void Next() override {
    try {
      advance();
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  std::exception_ptr error() const { return error_; }

 private:
  void advance() {
    while (true) {
      if (take_sentence()) return;
      if (reader_ && reader_->next(document_)) {
        offset_ = 0;
        continue;
      }
      if (next_input_ == inputs_.size()) {
        done_ = true;
        return;
      }
      reader_ = std::make_unique<DocumentReader>(inputs_[next_input_++]);
      document_.clear();
      offset_ = 0;
    }
  }

  // Cuts the next non-blank line (or a piece of an over-long line) out of document_.
  bool take_sentence() {
    while (offset_ < document_.size()) {
      size_t end = document_.find('\n', offset_);
      if (end == std::string::npos) end = document_.size();
      if (end - offset_ > kMaxSentenceBytes) {
        size_t cut = document_.rfind(' ', offset_ + kMaxSentenceBytes);
        if (cut == std::string::npos || cut <= offset_) {
          cut = offset_ + kMaxSentenceBytes;
          while (cut > offset_ && (static_cast<unsigned char>(document_[cut]) & 0xC0) == 0x80) {
            --cut;  // do not split a multi-byte UTF-8 character
          }
        }
        end = cut;
      }
      value_.assign(document_, offset_, end - offset_);
      offset_ =
          end +
          ((end < document_.size() && (document_[end] == '\n' || document_[end] == ' ')) ? 1 : 0);
      if (value_.find_first_not_of(" \t\r") != std::string::npos) return true;
    }
    return false;
  }

  const std::vector<std::string>& inputs_;
  size_t next_input_ = 0;
  std::unique_ptr<DocumentReader> reader_;
  std::string document_;
  size_t offset_ = 0;
  std::string value_;
  bool done_ = false;
  std::exception_ptr error_;
};

// sentencepiece's .vocab format: "piece<TAB>score" per line, in id order.
std::string vocab_listing(const std::string& serialized_model) {
  sentencepiece::SentencePieceProcessor processor;
  const auto status = processor.LoadFromSerializedProto(serialized_model);
  GNMR_CHECK(status.ok(), "reload of the freshly trained tokenizer: " + status.ToString());
  std::ostringstream out;
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    out << processor.IdToPiece(id) << "\t" << processor.GetScore(id) << "\n";
  }
  return out.str();
}

// A tokenizer is what a run's shards were cut with: writing over one would make every shard
// prepared with it unreadable as what it was. Nothing is overwritten (exit 4, as prepare).
void refuse_existing_outputs(const std::string& prefix) {
  for (const char* ext : {".model", ".vocab"}) {
    std::error_code ec;
    if (std::filesystem::exists(prefix + ext, ec)) {
      throw Error(ErrorKind::Data, "tokenizer train: " + prefix + ext +
                                       " already exists; choose a new --out or remove it");
    }
  }
}

}  // namespace

void train_tokenizer(const TokenizerTrainOptions& options) {
  if (options.inputs.empty()) {
    throw Error(ErrorKind::Usage, "tokenizer train: no input files given");
  }
  if (options.vocab_size < 260) {
    // 3 specials + 256 byte-fallback pieces come first; below that nothing is learned.
    throw Error(ErrorKind::Usage, "tokenizer train: --vocab-size " +
                                      std::to_string(options.vocab_size) +
                                      " is too small (at least 260: 3 special + 256 byte pieces)");
  }
  if (options.out_prefix.empty()) {
    throw Error(ErrorKind::Usage, "tokenizer train: --out PREFIX is required");
  }
  check_inputs_readable(options.inputs);
  refuse_existing_outputs(options.out_prefix);  // before the training, not after its hours
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  // The trainer_spec and normalizer_spec of LLaMA-2's tokenizer.model, bar corpus-size knobs.
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", "0.99995"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"split_by_unicode_script", "true"},
      {"split_by_number", "true"},
      {"split_by_whitespace", "true"},
      {"treat_whitespace_as_suffix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"hard_vocab_limit", "true"},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
  };
  sentencepiece::SetRandomGeneratorSeed(0x5eed);  // reservoir sampling: reproducible models

  spdlog::info("training a {}-piece BPE tokenizer on {} input(s)", options.vocab_size,
               options.inputs.size());
  CorpusSentenceIterator sentences(options.inputs);
  if (sentences.error()) std::rethrow_exception(sentences.error());
  if (sentences.done()) {
    throw Error(ErrorKind::Data,
                "tokenizer train: the inputs hold no documents (only empty or "
                "blank lines, or empty \"text\" fields)");
  }
  std::string serialized_model;
  const auto status =
      sentencepiece::SentencePieceTrainer::Train(spec, &sentences, &serialized_model);
  if (sentences.error()) std::rethrow_exception(sentences.error());
  if (!status.ok()) {
    // sentencepiece's own message names the vocab size it wants when that is the cause.
    throw Error(ErrorKind::Data, "tokenizer train: sentencepiece failed: " + status.ToString());
  }

  refuse_existing_outputs(options.out_prefix);  // one may have appeared while training
  const auto parent = std::filesystem::path(options.out_prefix).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomic(options.out_prefix + ".model", serialized_model);
  write_file_atomic(options.out_prefix + ".vocab", vocab_listing(serialized_model));
  spdlog::info("wrote {}.model and {}.vocab", options.out_prefix, options.out_prefix);
}

}  // namespace gnmr
