// How sm_90a's warpgroup MMA (wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16) finds its
// operands in shared memory, and how the flash forward's wgmma kernel
// (kernels/flash_attention_mma.cu, flash_forward_wgmma_kernel) lays its q, k and v tiles out
// for it. Plain host + device functions: the kernel places tiles by wgmma_tile_element and
// describes them by the descriptor builders below; the CUDA emulation (tests/emulated_cuda)
// reads an operand through wgmma_operand_byte, the descriptor's definition; a CPU test
// (tests/backend/test_wgmma_operand.cpp) checks, element by element, that every operand the
// kernel describes is the block of the tile it means.
//
// The facts, from the PTX ISA ("Matrix Descriptor Format", "Shared Memory Matrix Layout") and
// the canonical layouts CUTLASS's make_gmma_desc documents (cute/atom/mma_traits_sm90_gmma.hpp);
// not yet checked on a GPU (tests/gpu/test_gpu_flash_attention.cpp compares the kernel with
// the mma.sync one):
// - The descriptor (64 bits): bits 0-13 the operand's start address in the shared state space
//   >> 4; 16-29 the leading dimension byte offset (LBO) >> 4; 32-45 the stride dimension byte
//   offset (SBO) >> 4; 49-51 the base offset (0: only a swizzled layout needs it); 62-63 the
//   swizzle mode (0: none, the only mode used here).
// - Without swizzling an operand is made of core matrices of 8 rows of 16 bytes (8 bf16), each
//   128 contiguous bytes. LBO is the distance between core matrices adjacent along K, SBO
//   between those adjacent along M (A) or N (B). An operand is K-major when a core-matrix row
//   runs along K (A = Q and B = K^T in S = Q K^T: element (mn, k) is row mn of Q or K, column
//   k), MN-major when it runs along M or N (B = V in O = P V: B(k, n) is V's row k, column n,
//   and a core-matrix row holds 8 consecutive n of one k; wgmma's imm-trans-b = 1):
//     K-major:  start + (mn / 8) SBO + (k / 8) LBO + (mn % 8) 16 + (k % 8) 2
//     MN-major: start + (mn / 8) SBO + (k / 8) LBO + (k % 8) 16 + (mn % 8) 2
// - The accumulators (m64nN, fp32) and an A operand in registers (m64k16, bf16): warp w of the
//   warpgroup holds rows 16 w .. 16 w + 15, each 16-row slice in mma.sync m16n8k16's C (per
//   8 columns) and A fragments (src/backend/mma_fragment.h). So the kernel's softmax and P's
//   A fragments are the mma.sync kernel's, warp for warp.
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

constexpr int kWgmmaM = 64, kWgmmaN = 64, kWgmmaK = 16;
constexpr int kWgmmaCoreRows = 8, kWgmmaCoreRowBytes = 16, kWgmmaCoreBytes = 128;

// The descriptor of an operand at shared-state-space byte address `start` with the given
// offsets (bytes, multiples of 16, below 2^18), no swizzle, base offset 0.
GNMR_HD_INLINE uint64_t wgmma_descriptor(uint32_t start, uint32_t lbo, uint32_t sbo) {
  return uint64_t((start >> 4) & 0x3FFFu) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32);
}
GNMR_HD_INLINE uint32_t wgmma_descriptor_start(uint64_t desc) {
  return uint32_t(desc & 0x3FFFu) << 4;
}
GNMR_HD_INLINE uint32_t wgmma_descriptor_lbo(uint64_t desc) {
  return uint32_t((desc >> 16) & 0x3FFFu) << 4;
}
GNMR_HD_INLINE uint32_t wgmma_descriptor_sbo(uint64_t desc) {
  return uint32_t((desc >> 32) & 0x3FFFu) << 4;
}
// Bits 49-51 and 62-63: nonzero for a layout this file does not describe.
GNMR_HD_INLINE uint32_t wgmma_descriptor_base_offset(uint64_t desc) {
  return uint32_t((desc >> 49) & 0x7u);
}
GNMR_HD_INLINE uint32_t wgmma_descriptor_swizzle(uint64_t desc) {
  return uint32_t(desc >> 62);
}

// The descriptor of the operand `bytes` (a multiple of 16) after desc's start, the rest alike:
// one 64-bit add to the start field, as long as the start stays below 2^18 (shared memory is
// 228 KiB). A kernel builds its descriptors once and steps them by constants.
GNMR_HD_INLINE uint64_t wgmma_descriptor_advanced(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// The shared-state-space byte address of element (mn, k) of the no-swizzle operand `desc`
// describes, stored K-major (mn_major false) or MN-major: the formulas above.
GNMR_HD_INLINE uint32_t wgmma_operand_byte(uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t core = wgmma_descriptor_start(desc) +
                        uint32_t(mn / kWgmmaCoreRows) * wgmma_descriptor_sbo(desc) +
                        uint32_t(k / 8) * wgmma_descriptor_lbo(desc);
  return mn_major ? core + uint32_t(k % 8) * kWgmmaCoreRowBytes + uint32_t(mn % 8) * 2
                  : core + uint32_t(mn % 8) * kWgmmaCoreRowBytes + uint32_t(k % 8) * 2;
}

// The kernel's tiles (q: 64 or 128 query rows, k and v: 64 key rows; head_dim columns, bf16): in
// core matrices of 8 rows x 8 columns, a row group's head_dim / 8 core matrices side by side (128
// bytes apart), the row groups one after another (head_dim x 16 bytes apart). The bf16 element
// index of (row, col). A 16-byte chunk of a row (8 columns from a multiple of 8) is
// contiguous, so the tile copies stay cp.async's 16 bytes.
GNMR_HD_INLINE int wgmma_tile_element(int row, int col, int head_dim) {
  return (row / kWgmmaCoreRows) * head_dim * 8 + (col / 8) * (kWgmmaCoreBytes / 2) +
         (row % kWgmmaCoreRows) * 8 + col % 8;
}
GNMR_HD_INLINE int wgmma_tile_bytes(int rows, int head_dim) {
  return rows * head_dim * 2;
}

// The wgmma kernels' shared memory, byte offsets: q's tile of `query_rows` (64 or 128: one or
// two 64-row slabs, slab r's operand wgmma_tile_bytes(64, head_dim) r after the tile's), with
// `with_dout` (the dQ pass) dout's tile of as many rows, then the 64-row tiles of K and V (the
// dQ pass's two buffers, whose roles alternate).
struct FlashWgmmaSharedLayout {
  int q = 0, dout = 0, k = 0, v = 0, total_bytes = 0;
};
GNMR_HD_INLINE FlashWgmmaSharedLayout flash_wgmma_shared_layout(int head_dim, int query_rows,
                                                                bool with_dout = false) {
  FlashWgmmaSharedLayout l;
  l.q = 0;
  l.dout = l.q + wgmma_tile_bytes(query_rows, head_dim);
  l.k = with_dout ? l.dout + wgmma_tile_bytes(query_rows, head_dim) : l.dout;
  l.v = l.k + wgmma_tile_bytes(kWgmmaN, head_dim);
  l.total_bytes = l.v + wgmma_tile_bytes(kWgmmaN, head_dim);
  return l;
}

// The wgmma dK/dV pass's shared memory, byte offsets: K's and V's 64-row tiles, then two stages
// of a task's data, stage 1's stage_bytes after stage 0's: its q and dout tiles (64 query rows)
// and its lse and delta rows (64 floats each).
struct FlashWgmmaKeyValueLayout {
  int k = 0, v = 0, q = 0, dout = 0, lse = 0, delta = 0, stage_bytes = 0, total_bytes = 0;
};
GNMR_HD_INLINE FlashWgmmaKeyValueLayout flash_wgmma_key_value_layout(int head_dim) {
  const int tile = wgmma_tile_bytes(kWgmmaM, head_dim), rows_bytes = kWgmmaN * 4;
  FlashWgmmaKeyValueLayout l;
  l.k = 0;
  l.v = tile;
  l.q = 2 * tile;
  l.dout = 3 * tile;
  l.lse = 4 * tile;
  l.delta = l.lse + rows_bytes;
  l.stage_bytes = 2 * tile + 2 * rows_bytes;
  l.total_bytes = l.q + 2 * l.stage_bytes;
  return l;
}

// S = Q K^T: the 64 x 16 blocks of the tile at `tile` (Q as A, or K as B = K^T), K-major: the
// two core matrices along K 128 bytes apart, the row groups head_dim x 16. The descriptor of
// k-step 0 (head-dim columns 0-15), and of k-step kk (columns 16 kk .. 16 kk + 15) from it.
GNMR_HD_INLINE uint64_t wgmma_scores_operand(uint32_t tile, int head_dim) {
  return wgmma_descriptor(tile, kWgmmaCoreBytes, uint32_t(head_dim) * 16);
}
GNMR_HD_INLINE uint64_t wgmma_scores_step(uint64_t operand, int kk) {
  return wgmma_descriptor_advanced(operand, uint32_t(kk) * 2 * kWgmmaCoreBytes);
}
// O += P V: the 16 x 64 blocks of V's tile at `tile` as B, MN-major: along K (keys) the row
// groups head_dim x 16 bytes apart, along N (head dim) the core matrices 128. The descriptor of
// keys 0-15 and output columns 0-63, and of k-step kk (keys 16 kk .. 16 kk + 15) and output
// columns 64 h .. 64 h + 63 from it.
GNMR_HD_INLINE uint64_t wgmma_values_operand(uint32_t tile, int head_dim) {
  return wgmma_descriptor(tile, uint32_t(head_dim) * 16, kWgmmaCoreBytes);
}
GNMR_HD_INLINE uint64_t wgmma_values_step(uint64_t operand, int kk, int h, int head_dim) {
  return wgmma_descriptor_advanced(operand, uint32_t(kk) * 2 * uint32_t(head_dim) * 16 +
                                                uint32_t(h) * (kWgmmaN / 8) * kWgmmaCoreBytes);
}

}  // namespace gnmr
