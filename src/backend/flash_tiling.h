// The tiling of causal flash attention: which (query tile, key tile) pairs exist, which of them
// need the causal mask, and the extent of the last partial tile. Host + device, so the GPU
// kernel (issue: flash attention) and its CPU twin (cpu/flash_attention.h) iterate over exactly
// the same tiles, and a CPU test can check the rules for every sequence length.
//
// Queries are split into tiles of q_tile rows, keys into tiles of kv_tile rows. Causal: query
// i sees keys j <= i. Query tile qi needs key tiles 0 .. flash_last_kv_tile(qi); key tile kj is
// needed by query tiles flash_first_q_tile(kj) .. flash_q_tiles - 1. A pair needs the mask when
// one of its keys lies after one of its queries.
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

struct FlashTiling {
  int64_t seq = 0;
  int64_t q_tile = 64;
  int64_t kv_tile = 64;
};

GNMR_HD_INLINE int64_t flash_q_tiles(const FlashTiling& t) {
  return (t.seq + t.q_tile - 1) / t.q_tile;
}
GNMR_HD_INLINE int64_t flash_kv_tiles(const FlashTiling& t) {
  return (t.seq + t.kv_tile - 1) / t.kv_tile;
}
// Rows in tile `index` of `tile` rows: `tile`, or fewer for the last one.
GNMR_HD_INLINE int64_t flash_tile_rows(int64_t index, int64_t tile, int64_t seq) {
  const int64_t left = seq - index * tile;
  return left < tile ? left : tile;
}
// The key tile holding the last key query tile qi sees (its last query's position).
GNMR_HD_INLINE int64_t flash_last_kv_tile(const FlashTiling& t, int64_t qi) {
  const int64_t last_query = qi * t.q_tile + flash_tile_rows(qi, t.q_tile, t.seq) - 1;
  return last_query / t.kv_tile;
}
// The query tile holding the first query that sees key tile kj (its first key's position).
GNMR_HD_INLINE int64_t flash_first_q_tile(const FlashTiling& t, int64_t kj) {
  return kj * t.kv_tile / t.q_tile;
}
// True when some key of tile kj lies after some query of tile qi (the pair's mask matters).
GNMR_HD_INLINE bool flash_tile_is_masked(const FlashTiling& t, int64_t qi, int64_t kj) {
  const int64_t last_key = kj * t.kv_tile + flash_tile_rows(kj, t.kv_tile, t.seq) - 1;
  return last_key > qi * t.q_tile;
}

// True when tile pair (qi, kj), at its full q_tile x kv_tile extent, holds any score the
// tensor-core kernels must mask: a key after a query (flash_tile_is_masked), or a row of a
// partial tile (the missing keys and queries are zero rows in shared memory, whose scores would
// otherwise count in the softmax sums and the dK/dV pass's sums over queries). The other pairs,
// most of a long sequence's, skip the per-element mask.
GNMR_HD_INLINE bool flash_tile_needs_mask(const FlashTiling& t, int64_t qi, int64_t kj) {
  return flash_tile_is_masked(t, qi, kj) || flash_tile_rows(qi, t.q_tile, t.seq) < t.q_tile ||
         flash_tile_rows(kj, t.kv_tile, t.seq) < t.kv_tile;
}

}  // namespace gnmr
