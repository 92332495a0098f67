// `gnmr prepare`: corpus files -> tokenized train/val shards.
//
// Documents (see document_reader.h) are encoded as BOS + tokens + EOS. Document i (counted
// over all inputs in order) goes to the validation split iff
// hash(seed, i) / 2^64 < val_fraction — explicit and deterministic. Each split is cut into
// shards of about shard_tokens tokens without splitting a document (a document longer than
// shard_tokens gets a shard of its own): OUT/train_000000.bin, ..., OUT/val_000000.bin, ...,
// plus OUT/prepare.json describing the run.
//
// Reading, tokenizing and writing run as a pipeline (one reader, `threads` tokenizing
// workers, an in-order writer) with a bounded number of batches in flight, so memory stays
// constant on a corpus of any size and the output is byte-identical for any thread count.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace gnmr {

struct PrepareOptions {
  std::string tokenizer;  // sentencepiece .model
  std::string out_dir;    // created if missing; must not already hold shards
  std::vector<std::string> inputs;
  double val_fraction = 0.005;
  uint64_t seed = 0;
  int threads = 0;  // tokenizing workers; 0 = hardware concurrency
  int64_t shard_tokens = 100'000'000;
  bool progress = true;  // a live line on a terminal, else periodic log lines
  // When it holds a signal number (set by `gnmr prepare`'s SIGINT/SIGTERM/SIGHUP handler),
  // prepare stops after the batch it is writing, as a failure: its shards are removed.
  const std::atomic<int>* stop_signal = nullptr;
};

struct PrepareSummary {
  int64_t documents = 0;
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> train_shards;  // paths, in order
  std::vector<std::string> val_shards;
  // Lines whose invalid UTF-8 bytes were replaced by U+FFFD (document_reader.h), and the
  // first of them as FILE:LINE ("" when none).
  int64_t invalid_utf8_lines = 0;
  std::string first_invalid_utf8_line;
};

// Errors (all Error(ErrorKind::Data) unless noted): a missing input or tokenizer, an input
// named .gz that is not gzip, inputs that hold no document at all, an out_dir that already
// holds shards, a malformed JSON Lines record (naming file:line);
// bad option values are ErrorKind::Usage; a stop_signal is ErrorKind::Runtime. On failure the
// shards written so far are removed, and the output directory if this run made it: shards are
// kept only once prepare.json, written last, describes them.
PrepareSummary run_prepare(const PrepareOptions& options);

// The shards a run reads (FIELD: the config field or flag that named them, for messages) are
// a prepare's finished output. A directory with prepare.json must list every shard read from
// it; one without prepare.json but with a prepare's unfinished shard (NAME.bin.tmp.PID) holds
// the shards of a prepare that was killed: an Error(Data) naming it, where reading them would
// train on part of the corpus unsaid. A directory with neither is warned about (shards written
// by other tools carry no prepare.json) where `warn` (one rank of a job: every rank checks).
void check_prepared_shards(const std::string& field, const std::vector<std::string>& paths,
                           bool warn = true);

}  // namespace gnmr
