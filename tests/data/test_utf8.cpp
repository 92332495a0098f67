// replace_invalid_utf8: well-formed text passes untouched; each byte outside a well-formed
// sequence (Unicode 15 Table 3-7) becomes U+FFFD.
#include <gtest/gtest.h>

#include <string>

#include "data/utf8.h"

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

std::string replaced(std::string text, size_t expected_count) {
  EXPECT_EQ(gnmr::replace_invalid_utf8(text), expected_count) << text;
  return text;
}

}  // namespace

TEST(Utf8, WellFormedTextIsLeftAlone) {
  for (const std::string& text :
       {std::string(""), std::string("plain ASCII"), std::string("\xC3\x85ngstr\xC3\xB6m"),
        std::string("\xE2\x80\x94 dash"), std::string("\xED\x9F\xBF"),  // U+D7FF
        std::string("\xEE\x80\x80"),                                    // U+E000
        std::string("\xF0\x9F\x98\x80"),                                // U+1F600
        std::string("\xF4\x8F\xBF\xBF")}) {                             // U+10FFFF
    EXPECT_EQ(replaced(text, 0), text);
  }
}

TEST(Utf8, EachInvalidByteBecomesOneReplacementCharacter) {
  const std::string r = kReplacement;
  EXPECT_EQ(replaced("a\x80z", 1), "a" + r + "z");                           // lone continuation
  EXPECT_EQ(replaced("caf\xE9!", 1), "caf" + r + "!");                       // Latin-1 byte
  EXPECT_EQ(replaced("\xC0\xAF", 2), r + r);                                 // overlong '/'
  EXPECT_EQ(replaced("\xE0\x80\xAF", 3), r + r + r);                         // overlong 3-byte
  EXPECT_EQ(replaced("\xED\xA0\x80", 3), r + r + r);                         // surrogate U+D800
  EXPECT_EQ(replaced("\xF4\x90\x80\x80", 4), r + r + r + r);                 // above U+10FFFF
  EXPECT_EQ(replaced("\xF5\xFF", 2), r + r);                                 // never-valid leads
  EXPECT_EQ(replaced("end \xE2\x82", 2), "end " + r + r);                    // truncated at the end
  EXPECT_EQ(replaced("\xE2\x82 \xE2\x82\xAC", 2), r + r + " \xE2\x82\xAC");  // then a valid €
}
