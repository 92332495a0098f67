// Which matrix element each lane of a warp holds in the fragments of the tensor-core
// instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type"). Plain host + device functions: the tensor-core
// flash kernel (kernels/flash_attention_mma.cu) loads and stores its fragments through them,
// its host emulation assembles whole matrices through them, and a CPU test checks them against
// the ISA's formulas and that every element has exactly one (lane, register) owner.
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
