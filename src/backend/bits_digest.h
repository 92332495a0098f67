// A digest of a buffer's bits: whether two kernels wrote the same bits, learned without a
// second copy of the output (the tensor-core flash kernels' choice, docs/DESIGN.md §6). Each
// 32-bit word contributes splitmix64(splitmix64(index) ^ word), summed modulo 2^64: integer
// sums in any order give the same digest, so a GPU reduction tree equals the CPU's loop, and
// since splitmix64 is a bijection, buffers that differ in one word always differ in digest
// (in several, they agree by chance with odds of about 2^-64). Shared by the kernel
// (kernels/bits_digest.cu) and its CPU twin below.
#pragma once

#include <cstdint>

#include "precision/host_device.h"
#include "util/splitmix64.h"

namespace gnmr {

GNMR_HD_INLINE uint64_t bits_digest_term(uint64_t index, uint32_t word) {
  return splitmix64(splitmix64(index) ^ word);
}

// The CPU twin of cuda::bits_digest: the digest of words[0, count).
inline uint64_t bits_digest(const uint32_t* words, int64_t count) {
  uint64_t digest = 0;
  for (int64_t i = 0; i < count; ++i) digest += bits_digest_term(uint64_t(i), words[i]);
  return digest;
}

}  // namespace gnmr
