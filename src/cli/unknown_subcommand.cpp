#include "cli/unknown_subcommand.h"

#include <vector>

#include "util/nearest_name.h"

namespace gnmr {

std::string unknown_subcommand_message(const CLI::App& app) {
  // The deepest subcommand the parse reached ("gnmr tokenizer" for `gnmr tokenizer trian`).
  const CLI::App* level = &app;
  std::string command = "gnmr";  // not app.get_name(): CLI11 sets that to argv[0]
  while (!level->get_subcommands().empty()) {
    level = level->get_subcommands().front();
    command += " " + level->get_name();
  }
  if (level->get_require_subcommand_min() == 0) return "";
  std::string word;
  for (const std::string& extra : app.remaining(/*recurse=*/true)) {
    if (!extra.empty() && extra[0] != '-') {
      word = extra;
      break;
    }
  }
  if (word.empty()) return "";

  std::vector<std::string> names;
  std::string list;
  // Not the hidden ones (an empty group: gnmr's own wgmma-trial).
  for (const CLI::App* sub :
       level->get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); })) {
    names.push_back(sub->get_name());
    list += (list.empty() ? "" : ", ") + sub->get_name();
  }
  const std::string nearest = nearest_name(word, names);
  return "unknown subcommand \"" + word + "\"" +
         (nearest.empty() ? "" : " (did you mean \"" + nearest + "\"?)") + "; " + command +
         " takes one of: " + list;
}

}  // namespace gnmr
