// util/json_integer.h: an integer field of a JSON file reads as its value only when it is a
// whole number int64 holds; what nlohmann keeps as a uint64 past INT64_MAX or as a double out
// of range (whose conversion to int64 is undefined behaviour) reads as nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "util/json_integer.h"

namespace gnmr {
namespace {

using nlohmann::json;

TEST(JsonInteger, OnlyJsonIntegersThatInt64HoldsHaveAValue) {
  EXPECT_EQ(json_int64(json::parse("7")), 7);
  EXPECT_EQ(json_int64(json::parse("-7")), -7);
  EXPECT_EQ(json_int64(json::parse("0")), 0);
  EXPECT_EQ(json_int64(json::parse("9223372036854775807")), INT64_MAX);
  EXPECT_EQ(json_int64(json::parse("-9223372036854775808")), INT64_MIN);
  // Held as uint64 (2^63, 2^64 - 1) and as a double (2^64, past it): a wrap or UB if read.
  EXPECT_EQ(json_int64(json::parse("9223372036854775808")), std::nullopt);
  EXPECT_EQ(json_int64(json::parse("18446744073709551615")), std::nullopt);
  EXPECT_EQ(json_int64(json::parse("18446744073709551616")), std::nullopt);
  EXPECT_EQ(json_int64(json::parse("-9223372036854775809")), std::nullopt);
  for (const char* other : {"2.5", "1e3", "8.0", "1e300", "\"7\"", "null", "true", "[7]"}) {
    EXPECT_EQ(json_int64(json::parse(other)), std::nullopt) << other;
  }
}

TEST(JsonInteger, WholeFloatsBelowTwoToThe53ReadOnlyWhereAllowed) {
  EXPECT_EQ(json_int64_allowing_float(json::parse("8.0")), 8);
  EXPECT_EQ(json_int64_allowing_float(json::parse("-8.0")), -8);
  EXPECT_EQ(json_int64_allowing_float(json::parse("1e3")), 1000);
  EXPECT_EQ(json_int64_allowing_float(json::parse("8999999999999999.0")), 8999999999999999);
  EXPECT_EQ(json_int64_allowing_float(json::parse("12")), 12);
  EXPECT_EQ(json_int64_allowing_float(json::parse("9223372036854775807")), INT64_MAX);
  for (const char* other :
       {"8.5", "-0.5", "9.1e15", "1e300", "-1e300", "18446744073709551615", "\"8\"", "null"}) {
    EXPECT_EQ(json_int64_allowing_float(json::parse(other)), std::nullopt) << other;
  }
}

TEST(JsonInteger, TheProblemSaysOutOfRangeForWholeNumbersOnly) {
  for (const char* whole : {"9223372036854775808", "18446744073709551616", "1e16", "-1e300"}) {
    EXPECT_STREQ(json_int64_problem(json::parse(whole)), "is out of range") << whole;
  }
  for (const char* other : {"8.5", "\"7\"", "null", "[1]"}) {
    EXPECT_STREQ(json_int64_problem(json::parse(other)), "must be an integer") << other;
  }
}

}  // namespace
}  // namespace gnmr
