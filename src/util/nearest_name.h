// "Did you mean ...?" for a misspelt name: the candidate nearest by edit distance. Config keys
// (`train.lrr`) and subcommands (`gnmr trian`) share it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gnmr {

// Levenshtein distance: insertions, deletions and substitutions of single bytes.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to WORD, or "" when none is within max(2, |WORD| / 3) edits (so a
// word that resembles nothing gets no suggestion).
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace gnmr
