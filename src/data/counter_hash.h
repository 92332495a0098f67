// Counter-based hashing: a pure function from integers to well-mixed 64-bit values.
// The loader and the train/val split use it instead of a stateful RNG so that a batch or a
// split decision depends only on its coordinates (seed, rank, step, ...) — a resumed run, or
// a run with a different thread count, sees exactly the same data.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "util/splitmix64.h"

namespace gnmr {

// Hashes an ordered list of values; order matters, so (1, 2) and (2, 1) differ.
inline uint64_t hash_values(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x6A09E667F3BCC908ull;
  for (uint64_t v : values) h = splitmix64(h ^ splitmix64(v));
  return h;
}

// Maps a hash to a double uniform in [0, 1) using its top 53 bits.
inline double hash_to_unit(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace gnmr
