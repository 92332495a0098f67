// Counter-based random numbers for stochastic rounding: Philox-4x32-10 (Salmon et al.,
// "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11). The stream is a pure function of
// (seed, step, unit, element index), so a run is reproducible, resumable from a checkpoint
// and independent of thread count or GPU launch shape; host and device give equal bits.
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

// Identifies one quantization call: the run's seed, the training step and the unit
// (projection operator) whose tensor is quantized. Different keys give independent streams.
struct RngKey {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t unit = 0;
};

struct Philox4x32 {
  uint32_t v[4];
};

// Philox-4x32 with 10 rounds; constants from the Random123 reference implementation.
GNMR_HD_INLINE Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMul0) * counter.v[0];
    const uint64_t product1 = static_cast<uint64_t>(kMul1) * counter.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32),
                   lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32),
                   lo1 = static_cast<uint32_t>(product1);
    counter = Philox4x32{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// 32 random bits for element `index` of the stream `key`. One Philox block serves four
// consecutive elements (counter = index / 4, lane = index % 4).
GNMR_HD_INLINE uint32_t counter_rng_bits(const RngKey& key, uint64_t index) {
  const uint64_t block = index >> 2;
  const Philox4x32 counter{
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), key.step, key.unit}};
  const Philox4x32 out = philox4x32_10(counter, static_cast<uint32_t>(key.seed),
                                       static_cast<uint32_t>(key.seed >> 32));
  return out.v[index & 3];
}

// Uniform float in [0, 1) with 24 random bits: k * 2^-24, exact in float.
GNMR_HD_INLINE float counter_rng_uniform(const RngKey& key, uint64_t index) {
  return static_cast<float>(counter_rng_bits(key, index) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace gnmr
