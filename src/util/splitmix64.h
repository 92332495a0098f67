// splitmix64 finalizer (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a bijection on 64-bit integers with full avalanche. The one mixer behind every
// counter-based draw in gnmr: weight init (src/model/init.cpp), the loader and the train/val
// split (src/data/counter_hash.h), the random baseline controller (src/controller/baselines.cpp).
// Header-only, so src/controller can use it without linking anything else; host and device code
// (the bits digest, src/backend/bits_digest.h, runs it in a kernel).
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

constexpr uint64_t kSplitmix64Golden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio

GNMR_HD_INLINE uint64_t splitmix64(uint64_t x) {
  x += kSplitmix64Golden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace gnmr
