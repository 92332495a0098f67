// The order in which `data.sampling = shuffled` reads the training windows: for every epoch a
// pseudo-random permutation of the window indices [0, n), computed per index (no table, so a
// corpus of any size costs no memory and a resumed run recomputes exactly the same order).
//
// The permutation is a 4-round balanced Feistel network on the smallest even bit width 2h with
// 4^h >= n, each round keyed by (seed, epoch, round); values that land at or beyond n are
// mapped again ("cycle walking") until they fall inside [0, n). A Feistel network is a
// bijection of [0, 4^h) whatever its round function, and cycle walking restricts a bijection to
// the subset, so every index of [0, n) appears exactly once per epoch. Since 4^h <= 4n, a lookup
// takes at most 4 passes of the network on average.
#pragma once

#include <cstdint>

#include "data/counter_hash.h"

namespace gnmr {

// Half the Feistel width: the smallest h with 4^h >= n (h >= 1, so n = 1 or 2 still permutes).
inline int feistel_half_bits(int64_t n) {
  int h = 1;
  while (h < 31 && (int64_t{1} << (2 * h)) < n) ++h;
  return h;
}

// Index INDEX of epoch EPOCH's order: a window index in [0, n). n >= 1, 0 <= index < n.
inline int64_t permuted_window(uint64_t seed, uint64_t epoch, int64_t index, int64_t n) {
  const int h = feistel_half_bits(n);
  const uint64_t mask = (uint64_t{1} << h) - 1;
  uint64_t x = static_cast<uint64_t>(index);
  do {
    uint64_t left = x >> h, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t mixed = left ^ (hash_values({seed, epoch, round, right}) & mask);
      left = right;
      right = mixed;
    }
    x = (left << h) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

}  // namespace gnmr
