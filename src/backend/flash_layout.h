// The launch shape of the flash-attention GPU kernels (kernels/flash_attention.cu): how many
// thread blocks each kernel runs and where its tiles lie in shared memory. Plain host + device
// functions, so the kernel reads its offsets from here and a CPU test checks the sizes and the
// grids for every shape without a GPU. The tiles themselves follow flash_tiling.h.
//
// Tiles in shared memory are row-major fp32. Rows that a warp reads across (K and V rows in
// the score products, the score tile itself) are padded by one float, so 32 threads reading
// the same column of 32 different rows hit 32 different banks.
#pragma once

#include <cstdint>

#include "backend/flash_tiling.h"

namespace gnmr {

constexpr int kFlashThreads = 256;  // threads per block of every flash kernel
constexpr int64_t kFlashQTile = 64;
constexpr int64_t kFlashKvTile = 64;

// The tiling the GPU kernels run for a sequence of `seq` (the CPU twin is called with the
// same one in the tests).
GNMR_HD_INLINE FlashTiling flash_gpu_tiling(int64_t seq) {
  return FlashTiling{seq, kFlashQTile, kFlashKvTile};
}

// Elements of a tile x head_dim register tile (the forward's output accumulator, pass 1's dK and
// dV, pass 2's dQ) each thread owns: element e = thread + a * kFlashThreads for a below this,
// row e / head_dim, column e % head_dim. Every element has one owner when the tile's size is a
// multiple of kFlashThreads (head dims 64 and 128 with 64-row tiles).
GNMR_HOST_DEVICE constexpr int64_t flash_owned_per_thread(int64_t head_dim) {
  return kFlashQTile * head_dim / kFlashThreads;
}

// Offsets in floats of each tile in one block's dynamic shared memory, and the total. The
// forward uses q, k, v, s and the row vectors m, l, rescale; pass 1 (dK/dV) uses q, dout, k,
// v, s (P) and ds and the row vectors lse, delta; pass 2 (dQ) the same as pass 1.
struct FlashSharedLayout {
  int64_t q = 0, dout = 0, k = 0, v = 0, s = 0, ds = 0, row_a = 0, row_b = 0, row_c = 0;
  int64_t total_floats = 0;
  int64_t row_stride = 0;    // of q and dout tiles: head_dim
  int64_t kv_stride = 0;     // of k and v tiles: head_dim + 1
  int64_t score_stride = 0;  // of s and ds tiles: kv_tile + 1
};

enum class FlashKernel { Forward, BackwardKeyValue, BackwardQuery };

GNMR_HD_INLINE FlashSharedLayout flash_shared_layout(FlashKernel kernel, int64_t head_dim,
                                                     const FlashTiling& t) {
  FlashSharedLayout l;
  l.row_stride = head_dim;
  l.kv_stride = head_dim + 1;
  l.score_stride = t.kv_tile + 1;
  const bool backward = kernel != FlashKernel::Forward;
  int64_t at = 0;
  l.q = at;
  at += t.q_tile * l.row_stride;
  if (backward) {
    l.dout = at;
    at += t.q_tile * l.row_stride;
  }
  l.k = at;
  at += t.kv_tile * l.kv_stride;
  l.v = at;
  at += t.kv_tile * l.kv_stride;
  l.s = at;
  at += t.q_tile * l.score_stride;
  if (backward) {
    l.ds = at;
    at += t.q_tile * l.score_stride;
  }
  l.row_a = at;
  at += t.q_tile;
  l.row_b = at;
  at += t.q_tile;
  l.row_c = at;
  at += t.q_tile;
  l.total_floats = at;
  return l;
}

GNMR_HD_INLINE int64_t flash_shared_bytes(FlashKernel kernel, int64_t head_dim,
                                          const FlashTiling& t) {
  return flash_shared_layout(kernel, head_dim, t).total_floats * int64_t(sizeof(float));
}

// Thread blocks of each kernel: the forward and pass 2 one per (batch, head, query tile), pass 1
// one per (batch, kv head, key tile). A 1-D grid; the caller checks it against 2^31 - 1.
GNMR_HD_INLINE int64_t flash_grid_blocks(FlashKernel kernel, int64_t batch, int64_t heads,
                                         int64_t kv_heads, const FlashTiling& t) {
  if (kernel == FlashKernel::BackwardKeyValue) return batch * kv_heads * flash_kv_tiles(t);
  return batch * heads * flash_q_tiles(t);
}

// The shape every flash kernel reads its rows by, and where a row starts in the global tensors:
// q, out, dout, dq [B, T, H, hd]; k, v, dk, dv [B, T, Hkv, hd]; lse, delta [B, H, T].
struct FlashDims {
  int64_t batch, seq, heads, kv_heads;
};
GNMR_HD_INLINE int64_t flash_q_offset(const FlashDims& s, int64_t b, int64_t t, int64_t h,
                                      int64_t head_dim) {
  return ((b * s.seq + t) * s.heads + h) * head_dim;
}
GNMR_HD_INLINE int64_t flash_kv_offset(const FlashDims& s, int64_t b, int64_t t, int64_t g,
                                       int64_t head_dim) {
  return ((b * s.seq + t) * s.kv_heads + g) * head_dim;
}
GNMR_HD_INLINE int64_t flash_stat_offset(const FlashDims& s, int64_t b, int64_t h, int64_t t) {
  return (b * s.heads + h) * s.seq + t;
}

// What block `block` of a kernel's grid (flash_grid_blocks) computes: its batch row, its head
// and the kv head that head reads (in the dK/dV pass both the kv head), and its tile (a query
// tile; in the dK/dV pass a key tile). The blocks of one (batch, head) are consecutive and the
// longest first: under the causal mask query tile qi visits qi + 1 key tiles, so the forward's
// and the dQ pass's block i of a head takes query tile q_tiles - 1 - i, and key tile kj is seen
// by q_tiles - flash_first_q_tile(kj) query tiles, so the dK/dV pass's block i takes key tile i.
// A GPU starts blocks about in index order, so the blocks still running when the others are
// done, the grid's tail, are the shortest ones (in index order it would be a whole head's
// longest). 32-bit arithmetic: no 64-bit division on the GPU, and a grid has fewer than 2^31
// blocks (flash_launch::launch_blocks checks).
struct FlashBlockTask {
  int64_t batch = 0, head = 0, kv_head = 0, tile = 0;
};
GNMR_HD_INLINE FlashBlockTask flash_block_task(FlashKernel kernel, uint32_t block,
                                               const FlashDims& s, const FlashTiling& t) {
  const bool per_key_tile = kernel == FlashKernel::BackwardKeyValue;
  const uint32_t tiles = uint32_t(per_key_tile ? flash_kv_tiles(t) : flash_q_tiles(t));
  const uint32_t heads = uint32_t(per_key_tile ? s.kv_heads : s.heads);
  const uint32_t group = uint32_t(s.heads) / uint32_t(s.kv_heads);  // query heads per kv head
  const uint32_t index = block % tiles, row_head = block / tiles;
  FlashBlockTask task;
  task.batch = row_head / heads;
  task.head = row_head % heads;
  task.kv_head = per_key_tile ? task.head : uint32_t(task.head) / group;
  task.tile = per_key_tile ? index : tiles - 1 - index;
  return task;
}

// The tensor-core kernels (kernels/flash_attention_mma.cu): kFlashMmaWarps warps per block,
// each owning 16 rows (one mma M) of the 64-row query tile, over the same 64-key tiles.
constexpr int kFlashMmaWarps = 4;
constexpr int kFlashMmaThreads = kFlashMmaWarps * 32;
static_assert(kFlashMmaWarps * 16 == kFlashQTile, "the warps cover the query tile");
static_assert(kFlashKvTile % 16 == 0, "the key tile is whole mma K steps");
// The tensor-core forward and dQ pass may take query tiles of two 16-row blocks a warp, 128
// rows, over the same 64-key tiles: twice the math per K and V tile they copy (the reasons, and
// the registers it costs, beside the kernels). Their tiling, for a query tile of 64 or 128 rows:
// lse and delta are per row, so the dK/dV pass's 64-row tiles read them whatever tile wrote them.
GNMR_HD_INLINE FlashTiling flash_mma_query_tiling(int64_t seq, int64_t query_tile) {
  return FlashTiling{seq, query_tile, kFlashKvTile};
}
// Whether a warp of the tensor-core forward has a score to compute in the key tile whose first
// key is at `first_key`: its last query row is at `last_query`, and `has_rows` says whether any
// of its rows exists (the others lie past the end of the sequence). Where not, every one of its
// scores there would be masked and the kernel skips the tile's math for it (in a 128-row tile,
// the first half's warps on the last key tile). Key tile 0 is never skipped by a warp with rows.
GNMR_HD_INLINE bool flash_mma_warp_sees_key_tile(int64_t first_key, int64_t last_query,
                                                 bool has_rows) {
  return has_rows && first_key <= last_query;
}
// The forward's default query tile: 128, as FlashAttention-2's forward. On a GPU the backend
// times it beside 64 at each shape's first forward and runs the faster
// (backend/cuda/flash_tile_choice.h); tests/gpu/bench_gpu_attention.cpp (scripts/gpu_check.sh
// attention-bench) measures both side by side.
constexpr int64_t kFlashMmaForwardQueryTile = 128;
// The backward's dQ pass may take 128-row query tiles too, at head dim 64 only: its dQ, P and dP
// for two row blocks a warp fit in 255 registers there and not at 128. The default tile,
// timed beside the other as the forward's.
GNMR_HD_INLINE int64_t flash_mma_query_pass_tile(int64_t head_dim) {
  return head_dim == 64 ? 2 * kFlashQTile : kFlashQTile;
}

// Their tiles in shared memory: bf16 tiles q and k, v (all kernels) and dout (the backward),
// each row-major with head_dim + 8 elements per row. The 8 extra elements (16 bytes) shift each
// row by 4 banks, so the 8 rows x 4 words of one fragment load fall on 32 different banks, and
// keep every row 16-byte aligned. Then, for the dK/dV pass only, the query tile's lse and delta
// as floats. The dK/dV pass keeps two stages of its per-query-tile data (q, dout, lse, delta),
// so the next tile's copies land while this one's math runs: stage 1's q and dout lie
// `stage_elements` after stage 0's, its lse and delta `stage_floats` after. Tile offsets are in
// bf16 elements, lse and delta in floats from the same base.
struct FlashMmaSharedLayout {
  int64_t q = 0, dout = 0, k = 0, v = 0;
  int64_t row_stride = 0;
  int64_t tile_elements = 0;  // bf16 elements of all tiles
  int64_t lse = 0, delta = 0;
  int64_t stage_elements = 0, stage_floats = 0;  // 0: one stage
  int64_t total_bytes = 0;
};
GNMR_HD_INLINE FlashMmaSharedLayout flash_mma_shared_layout(FlashKernel kernel, int64_t head_dim,
                                                            const FlashTiling& t) {
  FlashMmaSharedLayout l;
  l.row_stride = head_dim + 8;
  const bool two_stages = kernel == FlashKernel::BackwardKeyValue;
  int64_t at = 0;
  l.q = at;
  at += t.q_tile * l.row_stride;
  if (kernel != FlashKernel::Forward) {
    l.dout = at;
    at += t.q_tile * l.row_stride;
  }
  if (two_stages) {
    l.stage_elements = at;
    at += l.stage_elements;
  }
  l.k = at;
  at += t.kv_tile * l.row_stride;
  l.v = at;
  at += t.kv_tile * l.row_stride;
  l.tile_elements = at;
  l.total_bytes = at * 2;
  if (two_stages) {
    l.lse = (l.total_bytes + 3) / 4;
    l.delta = l.lse + t.q_tile;
    l.stage_floats = 2 * t.q_tile;
    l.total_bytes = (l.delta + t.q_tile + l.stage_floats) * 4;
  }
  return l;
}
GNMR_HD_INLINE int64_t flash_mma_shared_bytes(FlashKernel kernel, int64_t head_dim,
                                              const FlashTiling& t) {
  return flash_mma_shared_layout(kernel, head_dim, t).total_bytes;
}

// Floats of device scratch the backward needs: delta = rowsum(dout * out), [B, H, T].
GNMR_HD_INLINE int64_t flash_backward_scratch_floats(int64_t batch, int64_t heads, int64_t seq) {
  return batch * heads * seq;
}

// The tensor-core kernels' device buffers, as byte offsets, each region 256-byte aligned (the
// kernels read rows 16 bytes at a time):
// - inputs: bf16 copies of q, k, v, made by one conversion pass in the forward, so the kernels
//   read half the bytes of fp32 and convert nothing in their loops. The caller keeps them for
//   the backward (the CUDA backend per layer, in the attention state), which reads them instead
//   of q, k, v, so they are converted once a step, and q, k, v need not outlive the forward.
// - scratch, the backward's alone: dout's bf16 copy, then delta (flash_backward_scratch_floats).
struct FlashMmaBuffers {
  int64_t q = 0, k = 0, v = 0, inputs_bytes = 0;
  int64_t dout = 0, delta = 0, scratch_bytes = 0;
};
GNMR_HD_INLINE int64_t flash_round_up_256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}
GNMR_HD_INLINE FlashMmaBuffers flash_mma_buffers(const FlashDims& s, int64_t head_dim) {
  const int64_t q_bytes = flash_round_up_256(2 * s.batch * s.seq * s.heads * head_dim);
  const int64_t kv_bytes = flash_round_up_256(2 * s.batch * s.seq * s.kv_heads * head_dim);
  FlashMmaBuffers l;
  l.q = 0;
  l.k = l.q + q_bytes;
  l.v = l.k + kv_bytes;
  l.inputs_bytes = l.v + kv_bytes;
  l.dout = 0;
  l.delta = l.dout + q_bytes;
  l.scratch_bytes = l.delta + 4 * flash_backward_scratch_floats(s.batch, s.heads, s.seq);
  return l;
}

}  // namespace gnmr
