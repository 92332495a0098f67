#include "data/utf8.h"

namespace gnmr {

namespace {

// Length of the well-formed sequence starting at TEXT[I], or 0 if none starts there.
size_t sequence_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char second_min = 0x80, second_max = 0xBF;  // Table 3-7's narrowed second bytes
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // no overlong 3-byte forms
    if (lead == 0xED) second_max = 0x9F;  // no surrogates U+D800..U+DFFF
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // no overlong 4-byte forms
    if (lead == 0xF4) second_max = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong), or F5..FF
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < second_min || byte(i + 1) > second_max) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

size_t replace_invalid_utf8(std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = sequence_length(text, i);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) return 0;  // valid: the common case copies nothing

  std::string out = text.substr(0, i);
  size_t replaced = 0;
  while (i < text.size()) {
    const size_t n = sequence_length(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++replaced;
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  text = std::move(out);
  return replaced;
}

}  // namespace gnmr
