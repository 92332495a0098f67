// FNV-1a, 64-bit: the checksum of controller-state blobs and the cross-rank agreement hashes
// of configs and weights. Not cryptographic; it detects damage and divergence. Header-only,
// so src/controller can use it without linking anything from the rest of the project.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gnmr {

constexpr uint64_t kFnv1aOffsetBasis = 0xcbf29ce484222325ull;

// Hash of `bytes` bytes at `data`, continuing from `hash` (chain calls to hash several
// buffers as one).
inline uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash = kFnv1aOffsetBasis) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace gnmr
