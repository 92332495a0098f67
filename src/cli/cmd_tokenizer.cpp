// `gnmr tokenizer train --vocab-size N --out PREFIX INPUT...`
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "data/tokenizer.h"

namespace gnmr {

CommandAction add_tokenizer_command(CLI::App& app) {
  app.require_subcommand(1);
  CLI::App* train =
      app.add_subcommand("train", "Train a sentencepiece BPE tokenizer with LLaMA-2's options");
  auto options = std::make_shared<TokenizerTrainOptions>();
  train->add_option("--vocab-size", options->vocab_size, "Number of pieces (LLaMA-2: 32000)")
      ->required()
      ->check(CLI::Range(16, 1 << 20));
  train
      ->add_option("--out", options->out_prefix,
                   "Output prefix: writes PREFIX.model and PREFIX.vocab")
      ->required();
  train->add_option("--threads", options->threads, "Training threads (0 = all cores)")
      ->capture_default_str();
  train
      ->add_option("--max-sentences", options->max_sentences,
                   "Lines sampled for training beyond this many")
      ->capture_default_str();
  train
      ->add_option("inputs", options->inputs, "Text, JSON Lines (\"text\" field), or .gz of either")
      ->required();
  return [train, options] {
    if (!train->parsed()) return;
    train_tokenizer(*options);
    spdlog::info("wrote {}.model and {}.vocab", options->out_prefix, options->out_prefix);
  };
}

}  // namespace gnmr
