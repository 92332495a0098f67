// The flags every config-taking subcommand shares: --config FILE and repeatable --set.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace gnmr {

struct ConfigFlags {
  std::string file;
  std::vector<std::string> overrides;
  RunConfig load() const { return load_run_config(file, overrides); }
};

inline std::shared_ptr<ConfigFlags> add_config_flags(CLI::App& app) {
  auto flags = std::make_shared<ConfigFlags>();
  app.add_option("--config", flags->file,
                 "Run config (JSON; may include model and precision presets)")
      ->required();  // a missing file is a config error (exit 3), named by the loader
  app.add_option("--set", flags->overrides, "Override a config value: KEY.PATH=VALUE (repeatable)");
  return flags;
}

}  // namespace gnmr
