// An injected environment for parse_launch_env: tests never touch the real one.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "parallel/launch_env.h"

namespace gnmr_test {

inline gnmr::EnvLookup env_map(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace gnmr_test
