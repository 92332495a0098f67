// gnmr: LLaMA-2 pretraining with a GNMR runtime precision controller.
// Entry point: parses the subcommand and maps every failure to a documented exit code.
#include <spdlog/spdlog.h>

#include <csignal>
#include <iostream>
#include <vector>

#include "backend/cpu/blas_autotune.h"
#include "cli/build_id.h"
#include "cli/commands.h"
#include "cli/unknown_subcommand.h"
#include "train/wgmma_trial.h"
#include "util/error.h"
#include "util/log.h"
#include "util/stop_signals.h"

int main(int argc, char** argv) {
  // A file past the size limit (ulimit -f, a quota on some filesystems) fails its write with
  // EFBIG, which every writer reports naming the file, instead of killing the process unsaid
  // between a checkpoint's files.
  std::signal(SIGXFSZ, SIG_IGN);
  // Until train and prepare install their handlers; every other command releases them below.
  gnmr::hold_stop_signals();
  // May re-execute gnmr with a better OpenBLAS kernel (the library picks it only when it loads).
  gnmr::autotune_blas_kernel(argv);
  CLI::App app{"gnmr — LLaMA-2 pretraining with a GNMR runtime precision controller"};
  app.require_subcommand(1);
  app.set_version_flag("--version", gnmr::gnmr_build_id());
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();

  std::vector<std::pair<CLI::App*, gnmr::CommandAction>> commands;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, adder(*sub));
  };
  add("train", "Pretrain a model from a config", gnmr::add_train_command);
  add("prepare", "Tokenize text / JSONL (optionally gzip) into token shards",
      gnmr::add_prepare_command);
  add("tokenizer", "Tokenizer tools (train a sentencepiece BPE model)",
      gnmr::add_tokenizer_command);
  add("eval", "Perplexity of a checkpoint or exported model on shards or a text file",
      gnmr::add_eval_command);
  add("export", "Write a checkpoint as a Hugging Face LlamaForCausalLM folder",
      gnmr::add_export_command);
  add("bench", "Measure training throughput, MFU and memory for a config", gnmr::add_bench_command);
  add("checkpoint", "Checkpoint tools (consolidate ZeRO-1 optimizer shards)",
      gnmr::add_checkpoint_command);
  add("config", "Config tools (show the fully resolved config)", gnmr::add_config_command);
  add("version", "Print the version and build features", gnmr::add_version_command);
  // Run by gnmr itself in a child process, not by users: out of --help (an empty group).
  CLI::App* wgmma_trial = app.add_subcommand("wgmma-trial", "The wgmma attention kernels' trial");
  wgmma_trial->group("");
  commands.emplace_back(wgmma_trial, gnmr::add_wgmma_trial_command(*wgmma_trial));
  gnmr::set_wgmma_trial_executable("/proc/self/exe");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const std::string unknown =
        e.get_exit_code() != 0 ? gnmr::unknown_subcommand_message(app) : std::string();
    if (!unknown.empty()) {
      std::cerr << "gnmr: error: " << unknown << "\n";
      return static_cast<int>(gnmr::ErrorKind::Usage);
    }
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(gnmr::ErrorKind::Usage);
  }

  try {
    gnmr::init_logging(log_level);
    for (auto& [sub, action] : commands) {
      if (!sub->parsed()) continue;
      if (sub->get_name() != "train" && sub->get_name() != "prepare") {
        gnmr::release_stop_signals();
      }
      action();
    }
  } catch (const gnmr::Error& e) {
    std::cerr << "gnmr: error: " << e.what() << "\n";
    gnmr::log_error_to_files(e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "gnmr: error: " << e.what() << "\n";
    gnmr::log_error_to_files(e.what());
    return static_cast<int>(gnmr::ErrorKind::Runtime);
  }
  return 0;
}
