// Subcommands whose implementation has not landed yet fail clearly instead of pretending.
#include "cli/commands.h"
#include "util/error.h"

namespace gnmr {

namespace {
CommandAction not_built(const std::string& name) {
  return [name] {
    throw Error(ErrorKind::NotBuilt, "`gnmr " + name + "` is not built yet in this version");
  };
}
}  // namespace

CommandAction add_train_command(CLI::App& app) {
  app.allow_extras();
  return not_built("train");
}
CommandAction add_prepare_command(CLI::App& app) {
  app.allow_extras();
  return not_built("prepare");
}
CommandAction add_tokenizer_command(CLI::App& app) {
  app.allow_extras();
  return not_built("tokenizer");
}
CommandAction add_eval_command(CLI::App& app) {
  app.allow_extras();
  return not_built("eval");
}
CommandAction add_export_command(CLI::App& app) {
  app.allow_extras();
  return not_built("export");
}
CommandAction add_bench_command(CLI::App& app) {
  app.allow_extras();
  return not_built("bench");
}

}  // namespace gnmr
