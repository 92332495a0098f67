// Reading an integer out of JSON that a user, a tool or a damaged file wrote. nlohmann's parser
// keeps a non-negative integer as uint64, a negative one as int64, and a number with a fraction
// or an exponent, or one past 2^64, as a double. get<int64_t>() wraps a uint64 above INT64_MAX
// and is undefined behaviour for a double out of int64's range, so a reader of a signed integer
// field takes it through these, then range-checks the value (the config's schema reader, which
// also takes uint64 fields, checks each type's range itself). Header-only, so src/controller
// can use it without linking the rest of the project.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace gnmr {

// V's value when it is a JSON integer that int64 holds; nothing for 2.5, 1e3, 2^63, "7" or null.
inline std::optional<int64_t> json_int64(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

// The same, also taking a whole number written as a float (8.0, 1e3: configs written by Python
// tools) below 9e15 in magnitude (just under 2^53: a double holds every such integer
// exactly); never 8.5.
inline std::optional<int64_t> json_int64_allowing_float(const nlohmann::json& v) {
  if (!v.is_number_float()) return json_int64(v);
  const double d = v.get<double>();
  if (std::floor(d) != d || !(std::fabs(d) < 9.0e15)) return std::nullopt;
  return int64_t(d);
}

// What is wrong with V where the two above gave nothing, for an error message: a whole number
// past their range (2^63, 1e16) "is out of range", anything else "must be an integer".
inline const char* json_int64_problem(const nlohmann::json& v) {
  const bool whole = v.is_number_integer() ||
                     (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return whole ? "is out of range" : "must be an integer";
}

}  // namespace gnmr
