// Range checks for numeric flags. CLI11's PositiveNumber and Range print their bounds as
// doubles ("not in range 0.000000 to 179769313486231570814527...") and call 0 positive
// inside the message; these say the rule in words: "--steps: must be at least 1 (got 0)".
// They read the text themselves: CLI11's own conversion clamps a number past 64 bits to the
// largest one (--steps 99999999999999999999 once trained 2^63 - 1 steps).
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace gnmr {

namespace validators_detail {

// "" when TEXT is a whole decimal number that long long holds (stored in VALUE), else the
// reason in words.
inline std::string parse_integer(const std::string& text, long long& value) {
  errno = 0;
  char* end = nullptr;
  value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0') {
    return "must be an integer (got " + text + ")";
  }
  if (errno == ERANGE) return "is out of range (got " + text + ")";
  return "";
}

}  // namespace validators_detail

inline CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long long value = 0;
        const std::string problem = validators_detail::parse_integer(text, value);
        if (!problem.empty()) return problem;
        if (value < min) return "must be at least " + std::to_string(min) + " (got " + text + ")";
        return "";
      },
      "INT>=" + std::to_string(min));
}

inline CLI::Validator in_range(long long min, long long max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        long long value = 0;
        const std::string problem = validators_detail::parse_integer(text, value);
        if (!problem.empty()) return problem;
        if (value < min || value > max) {
          return "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "] (got " +
                 text + ")";
        }
        return "";
      },
      "INT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

}  // namespace gnmr
