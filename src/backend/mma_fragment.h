// Which matrix element each lane of a warp holds in the fragments of the tensor-core
// instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type"), and how ldmatrix delivers them. Plain host +
// device functions: the tensor-core flash kernel (kernels/flash_attention_mma.cu) loads its
// fragments by ldmatrix with the row addresses below and stores its accumulators by the C rule,
// its host emulation assembles whole matrices through them, and a CPU test checks them against
// the ISA's formulas, that every element has exactly one (lane, register) owner, and that the
// kernel's ldmatrix addresses give exactly the mma fragments.
//
// D (16 x 8, fp32) = A (16 x 16, bf16, row-major) * B (16 x 8, bf16, "col": stored n-major, so
// a B column is contiguous) + C. Per lane, with group = lane / 4 and quad = lane % 4:
// - A: 8 bf16 elements a0..a7 in four 32-bit registers, a(2r) in the low half of register r;
//   rows group (a0, a1, a4, a5) and group + 8 (a2, a3, a6, a7), columns 2 quad + (i % 2), plus 8
//   for a4..a7.
// - B: 4 bf16 elements b0..b3 in two registers; column group, rows 2 quad + (i % 2), plus 8 for
//   b2, b3.
// - C, D: 4 floats c0..c3; rows group (c0, c1) and group + 8 (c2, c3), columns 2 quad + (i % 2).
#pragma once

#include "precision/host_device.h"

namespace gnmr {

constexpr int kWarpSize = 32;
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kMmaAElements = 8, kMmaBElements = 4, kMmaCElements = 4;

GNMR_HD_INLINE int mma_group(int lane) {
  return lane >> 2;
}
GNMR_HD_INLINE int mma_quad(int lane) {
  return lane & 3;
}

// A (m x k): element i of lane's fragment, i in [0, 8).
GNMR_HD_INLINE int mma_a_row(int lane, int i) {
  return mma_group(lane) + ((i & 2) ? 8 : 0);
}
GNMR_HD_INLINE int mma_a_col(int lane, int i) {
  return 2 * mma_quad(lane) + (i & 1) + ((i & 4) ? 8 : 0);
}

// B (k x n): element i of lane's fragment, i in [0, 4).
GNMR_HD_INLINE int mma_b_row(int lane, int i) {
  return 2 * mma_quad(lane) + (i & 1) + ((i & 2) ? 8 : 0);
}
GNMR_HD_INLINE int mma_b_col(int lane, int /*i*/) {
  return mma_group(lane);
}

// C and D (m x n): element i of lane's fragment, i in [0, 4).
GNMR_HD_INLINE int mma_c_row(int lane, int i) {
  return mma_group(lane) + ((i & 2) ? 8 : 0);
}
GNMR_HD_INLINE int mma_c_col(int lane, int i) {
  return 2 * mma_quad(lane) + (i & 1);
}

// A 16 x 16 product held as two C fragments (n-blocks 2j and 2j + 1, columns 0-7 and 8-15) is,
// element for element, the A fragment of a next product that takes it as its A (the
// FlashAttention-2 trick: P goes from the score product into P V without leaving registers).
// Element i of that A fragment is element mma_a_from_c_element(i) of n-block 2j +
// mma_a_from_c_block(i).
GNMR_HD_INLINE int mma_a_from_c_block(int i) {
  return i >> 2;
}
GNMR_HD_INLINE int mma_a_from_c_element(int i) {
  return i & 3;
}

// The lanes that hold the same rows of C are the four of a quad group: lane ^ 1, lane ^ 2 and
// lane ^ 3. A row's reduction (max, sum) over a 16 x 8k C tile is the lane's own elements, then
// two butterfly exchanges, with lane ^ 1 and with lane ^ 2.

// ---- ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 (PTX ISA, "Warp-level matrix load
// instruction: ldmatrix"): the warp loads four 8 x 8 matrices of 16-bit elements from shared
// memory, one 16-byte row per address. Lanes 8j..8j + 7 hand in the addresses of rows 0..7 of
// matrix j (16-byte aligned); register j of every lane receives a pair of matrix j's elements.
// Without .trans lane t holds row t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 (low half first);
// with .trans it holds column t / 4 of rows 2 (t % 4) and 2 (t % 4) + 1: the matrix as if
// stored column-major. Either way this is the mma fragment's (group, 2 quad) pattern, so the
// right four row addresses make one ldmatrix deliver a whole A fragment or two B fragments.
constexpr int kLdmatrixMatrices = 4, kLdmatrixRows = 8;

// Which matrix and row lane's address is.
GNMR_HD_INLINE int ldmatrix_address_matrix(int lane) {
  return lane / kLdmatrixRows;
}
GNMR_HD_INLINE int ldmatrix_address_row(int lane) {
  return lane % kLdmatrixRows;
}
// The (row, column) within its 8 x 8 matrix of half `half` (0 low, 1 high) of a lane's register.
GNMR_HD_INLINE int ldmatrix_element_row(int lane, int half, bool trans) {
  return trans ? 2 * mma_quad(lane) + half : mma_group(lane);
}
GNMR_HD_INLINE int ldmatrix_element_col(int lane, int half, bool trans) {
  return trans ? mma_group(lane) : 2 * mma_quad(lane) + half;
}

// The kernel's three ways of loading fragments with one ldmatrix each, by two address
// patterns: the (row, column) whose address `lane` hands in, relative to the block's first
// element, in a row-major bf16 tile.
// - ldmatrix_a_*: the A fragment of the 16 x 16 block, without .trans: matrices (rows 0-7,
//   cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) are the
//   registers a0a1, a2a3, a4a5, a6a7. With .trans the same addresses give the B fragments of
//   two n-blocks from a tile whose rows are k and columns n (V in O = P V): registers b[0][0],
//   b[0][1] (n 0-7; k 0-7, 8-15), then b[1][0], b[1][1] (n 8-15).
GNMR_HD_INLINE int ldmatrix_a_row(int lane) {
  return ldmatrix_address_row(lane) + 8 * (ldmatrix_address_matrix(lane) & 1);
}
GNMR_HD_INLINE int ldmatrix_a_col(int lane) {
  return 8 * (ldmatrix_address_matrix(lane) >> 1);
}
// - ldmatrix_b_n_rows_*: the B fragments of two n-blocks from a tile whose rows are n and
//   columns k (K in S = Q K^T), without .trans, in the same register order: matrices (n 0-7,
//   k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
GNMR_HD_INLINE int ldmatrix_b_n_rows_row(int lane) {
  return ldmatrix_address_row(lane) + 8 * (ldmatrix_address_matrix(lane) >> 1);
}
GNMR_HD_INLINE int ldmatrix_b_n_rows_col(int lane) {
  return 8 * (ldmatrix_address_matrix(lane) & 1);
}

// Two bf16 codes in one 32-bit register: `low` is the element with the smaller index.
GNMR_HD_INLINE uint32_t pack_bf16_pair(uint16_t low, uint16_t high) {
  return uint32_t(low) | (uint32_t(high) << 16);
}
GNMR_HD_INLINE uint16_t bf16_pair_low(uint32_t pair) {
  return uint16_t(pair & 0xFFFFu);
}
GNMR_HD_INLINE uint16_t bf16_pair_high(uint32_t pair) {
  return uint16_t(pair >> 16);
}

}  // namespace gnmr
