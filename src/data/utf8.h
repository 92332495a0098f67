// Invalid UTF-8 in corpus text. sentencepiece turns every byte that does not start a valid
// UTF-8 sequence into U+FFFD without a word; the document reader makes the same replacement
// itself, so that `gnmr prepare` can count the lines it happened on and name the first.
#pragma once

#include <cstddef>
#include <string>

namespace gnmr {

// Replaces each byte of TEXT that is not part of a well-formed UTF-8 sequence (Unicode 15
// Table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF) with U+FFFD (EF BF BD).
// Returns the number of bytes replaced; TEXT is untouched when it is valid.
size_t replace_invalid_utf8(std::string& text);

}  // namespace gnmr
