// `gnmr prepare --tokenizer MODEL --out DIR [--val-fraction F] [--seed S] [--threads N] INPUT...`
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/validators.h"
#include "data/prepare.h"

namespace gnmr {

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
    PrepareSummary s = run_prepare(*options);
    spdlog::info(
        "prepared {} documents: {} train tokens in {} shard(s), {} val tokens in {} shard(s) -> {}",
        s.documents, s.train_tokens, s.train_shards.size(), s.val_tokens, s.val_shards.size(),
        options->out_dir);
  };
}

}  // namespace gnmr
