// Range checks for numeric flags. CLI11's PositiveNumber and Range print their bounds as
// doubles ("not in range 0.000000 to 179769313486231570814527...") and call 0 positive
// inside the message; these say the rule in words: "--steps: must be at least 1 (got 0)".
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace gnmr {

inline CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long long value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "must be an integer (got " + text + ")";
        if (value < min) return "must be at least " + std::to_string(min) + " (got " + text + ")";
        return "";
      },
      "INT>=" + std::to_string(min));
}

}  // namespace gnmr
