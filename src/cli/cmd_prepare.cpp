// `gnmr prepare --tokenizer MODEL --out DIR [--val-fraction F] [--seed S] [--threads N] INPUT...`
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <iostream>

#include "cli/commands.h"
#include "cli/validators.h"
#include "data/prepare.h"
#include "util/error.h"
#include "util/stop_signals.h"

namespace gnmr {

namespace {

// SIGINT, SIGTERM and SIGHUP stop prepare through options.stop_signal after the batch it is
// writing, so its shards are removed (a second one ends it at once); then the process dies of
// the signal, as the shell that sent it expects (a loop of prepares stops at Ctrl-C).
void run_prepare_stopping_on_signals(PrepareOptions& options) {
  int stopped_by = 0;
  {
    StopSignals stop_signals({}, {SIGINT, SIGTERM, SIGHUP});
    options.stop_signal = &StopSignals::flag();
    try {
      PrepareSummary s = run_prepare(options);
      spdlog::info(
          "prepared {} documents: {} train tokens in {} shard(s), {} val tokens in {} shard(s) "
          "-> {}",
          s.documents, s.train_tokens, s.train_shards.size(), s.val_tokens, s.val_shards.size(),
          options.out_dir);
    } catch (const Error& e) {
      if (StopSignals::received() == 0) throw;
      std::cerr << "gnmr: error: " << e.what() << "\n";
    }
    // Also a signal after the last batch: the dataset is complete and stays, and the process
    // still ends by the signal it was sent.
    stopped_by = StopSignals::received();
  }  // the handlers from before are back
  if (stopped_by != 0) {
    std::signal(stopped_by, SIG_DFL);
    std::raise(stopped_by);
  }
}

}  // namespace

CommandAction add_prepare_command(CLI::App& app) {
  auto options = std::make_shared<PrepareOptions>();
  auto quiet = std::make_shared<bool>(false);
  app.add_option("--tokenizer", options->tokenizer,
                 "sentencepiece .model (e.g. data/brown/tokenizer.model)")
      ->required();
  app.add_option("--out", options->out_dir,
                 "Output directory for train_*.bin, val_*.bin, prepare.json")
      ->required();
  app.add_option("--val-fraction", options->val_fraction,
                 "Fraction of documents in the validation split")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", options->seed, "Seed of the document-level train/val split")
      ->capture_default_str();
  app.add_option("--threads", options->threads, "Tokenizing threads (0 = all cores)")
      ->capture_default_str();
  app.add_option("--shard-tokens", options->shard_tokens,
                 "Tokens per shard (documents are never split)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_flag("--no-progress", *quiet, "No live progress line");
  app.add_option("inputs", options->inputs,
                 "Text (.txt), JSON Lines with a \"text\" field (.jsonl), or .gz of either")
      ->required();
  return [options, quiet] {
    options->progress = !*quiet;
    run_prepare_stopping_on_signals(*options);
  };
}

}  // namespace gnmr
