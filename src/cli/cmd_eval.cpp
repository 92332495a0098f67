// `gnmr eval --checkpoint CKPT_DIR|HF_DIR (--data SHARD_GLOB | --text FILE) [--tokens N]
//            [--backend cpu|cuda] [--json]`
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/path_flags.h"
#include "cli/validators.h"
#include "config/config.h"
#include "train/evaluation.h"

namespace gnmr {

CommandAction add_eval_command(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  auto as_json = std::make_shared<bool>(false);
  app.add_option("--checkpoint", options->model_dir,
                 "gnmr checkpoint dir or Hugging Face LLaMA folder")
      ->required();
  auto* data = app.add_option("--data", options->data_glob, "Token shards (glob)");
  app.add_option("--text", options->text_file,
                 "Raw text file (tokenized with the model's tokenizer, no BOS)")
      ->excludes(data);
  app.add_option("--tokenizer", options->tokenizer,
                 "Tokenizer model for --text (default: CHECKPOINT/tokenizer.model)");
  app.add_option("--tokens", options->tokens, "Token budget (0 = all)")->capture_default_str();
  app.add_option("--seq-len", options->seq_len,
                 "Window length (default: the checkpoint's data.seq_len; for an HF folder, "
                 "max_position_embeddings up to 1024)");
  app.add_option("--batch", options->batch, "Windows per forward pass")->capture_default_str();
  app.add_option("--threads", options->threads, "CPU threads (0 = all cores)")
      ->check(in_range(0, kMaxThreads));
  app.add_option("--backend", options->backend,
                 "cpu or cuda (the local rank's GPU, or the only one visible)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--json", *as_json, "Print {\"loss\":…,\"ppl\":…,\"tokens\":…}");
  return [options, as_json] {
    require_directory("--checkpoint", options->model_dir, ErrorKind::Checkpoint);
    if (!options->text_file.empty()) require_file("--text", options->text_file, ErrorKind::Data);
    EvalResult r = evaluate_saved_model(*options);
    if (*as_json) {
      std::cout << nlohmann::json{{"loss", r.loss}, {"ppl", r.ppl}, {"tokens", r.tokens}}.dump()
                << "\n";
    } else {
      std::printf("loss %.6f  ppl %.4f  tokens %lld\n", r.loss, r.ppl,
                  static_cast<long long>(r.tokens));
    }
  };
}

}  // namespace gnmr
