// `gnmr config show`: prints the fully resolved config (defaults + includes + overrides).
#include <iostream>

#include "cli/commands.h"
#include "config/config.h"

namespace gnmr {

CommandAction add_config_command(CLI::App& app) {
  app.require_subcommand(1);
  CLI::App* show = app.add_subcommand("show", "Print the resolved config as JSON");
  auto file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  show->add_option("--config", *file, "Config file (JSON)")->required();
  show->add_option("--set", *overrides, "Override KEY.PATH=VALUE (repeatable)");
  return [show, file, overrides] {
    if (!show->parsed()) return;
    RunConfig config = load_run_config(*file, *overrides);
    std::cout << config.resolved.dump(2) << "\n";
  };
}

}  // namespace gnmr
