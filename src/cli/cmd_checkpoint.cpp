// `gnmr checkpoint consolidate RUN_OR_CHECKPOINT_DIR [--out DIR]`: joins the ZeRO-1 optimizer
// shards of a dist.zero=1 checkpoint into one optimizer.safetensors (train/zero_checkpoint.h),
// so the run can resume under another world size or without ZeRO-1.
#include <spdlog/spdlog.h>

#include <filesystem>

#include "cli/commands.h"
#include "cli/path_flags.h"
#include "train/checkpoint.h"
#include "train/zero_checkpoint.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace gnmr {

CommandAction add_checkpoint_command(CLI::App& app) {
  app.require_subcommand(1);
  CLI::App* consolidate = app.add_subcommand(
      "consolidate", "Join a ZeRO-1 checkpoint's optimizer shards (resumable on any world size)");
  auto source = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  consolidate
      ->add_option("source", *source,
                   "Checkpoint dir, or run dir (its newest intact checkpoint is used)")
      ->required();
  consolidate->add_option("--out", *out,
                          "Checkpoint dir to create (must not exist; default: the checkpoint's "
                          "path + \"_consolidated\")");
  return [consolidate, source, out] {
    if (!consolidate->parsed()) return;
    require_directory("checkpoint consolidate", *source, ErrorKind::Checkpoint);
    std::string checkpoint = *source;
    if (fs::is_directory(fs::path(*source) / "checkpoints")) {
      std::vector<std::string> skipped;
      checkpoint = newest_intact_checkpoint(*source, skipped);
      for (const std::string& line : skipped) spdlog::warn("{}", line);
      if (checkpoint.empty()) {
        throw Error(ErrorKind::Checkpoint, "run " + *source + " has no checkpoint to consolidate");
      }
    }
    const std::string target =
        out->empty() ? without_trailing_separator(checkpoint) + "_consolidated" : *out;
    consolidate_checkpoint(checkpoint, target);
    spdlog::info("consolidated {} into {}; resume with --resume {}", checkpoint, target, target);
  };
}

}  // namespace gnmr
