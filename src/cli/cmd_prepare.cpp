// `gnmr prepare --tokenizer MODEL --out DIR [--val-fraction F] [--seed S] [--threads N] INPUT...`
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <iostream>

#include "cli/commands.h"
#include "cli/validators.h"
#include "data/prepare.h"
#include "util/error.h"

namespace gnmr {

namespace {

std::atomic<int> g_prepare_signal{0};

// The first signal asks prepare to stop and clean up; a second one (Ctrl-C again, while a long
// batch finishes) ends the process at once, as the signal's default does.
void on_prepare_signal(int signal) {
  g_prepare_signal.store(signal);
  std::signal(signal, SIG_DFL);
}

// SIGINT, SIGTERM and SIGHUP stop prepare through options.stop_signal, so its shards are
// removed; then the process dies of the signal, as the shell that sent it expects (a loop of
// prepares stops at Ctrl-C). A signal the launcher ignores (nohup's SIGHUP, SIGINT of a
// script's background job) stays ignored.
void run_prepare_stopping_on_signals(PrepareOptions& options) {
  const int signals[] = {SIGINT, SIGTERM, SIGHUP};
  void (*previous[3])(int) = {};
  for (int i = 0; i < 3; ++i) {
    previous[i] = std::signal(signals[i], on_prepare_signal);
    if (previous[i] == SIG_IGN) std::signal(signals[i], SIG_IGN);
  }
  auto restore = [&] {
    for (int i = 0; i < 3; ++i) std::signal(signals[i], previous[i]);
  };
  options.stop_signal = &g_prepare_signal;
  try {
    PrepareSummary s = run_prepare(options);
    restore();
    spdlog::info(
        "prepared {} documents: {} train tokens in {} shard(s), {} val tokens in {} shard(s) -> "
        "{}",
        s.documents, s.train_tokens, s.train_shards.size(), s.val_tokens, s.val_shards.size(),
        options.out_dir);
    // A signal after the last batch: the dataset is complete and stays, and the process still
    // ends by the signal it was sent.
    if (const int late = g_prepare_signal.load(); late != 0) {
      std::signal(late, SIG_DFL);
      std::raise(late);
    }
  } catch (const Error& e) {
    restore();
    const int stopped_by = g_prepare_signal.load();
    if (stopped_by == 0) throw;
    std::cerr << "gnmr: error: " << e.what() << "\n";
    std::signal(stopped_by, SIG_DFL);
    std::raise(stopped_by);
    throw;  // not reached: the default action of these signals ends the process
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
