// The mma.sync m16n8k16 fragment rules (src/backend/mma_fragment.h) against the PTX ISA's
// formulas, written out here by hand for a few lanes, and the properties the tensor-core kernel
// relies on: every element of A, B and C held by exactly one (lane, element), and a product's C
// fragments reusable as the next product's A fragment.
#include <gtest/gtest.h>

#include <array>
#include <utility>
#include <vector>

#include "backend/mma_fragment.h"

namespace gnmr {
namespace {

using RowCol = std::pair<int, int>;

std::array<RowCol, 8> a_elements(int lane) {
  std::array<RowCol, 8> e;
  for (int i = 0; i < 8; ++i) e[size_t(i)] = {mma_a_row(lane, i), mma_a_col(lane, i)};
  return e;
}
std::array<RowCol, 4> b_elements(int lane) {
  std::array<RowCol, 4> e;
  for (int i = 0; i < 4; ++i) e[size_t(i)] = {mma_b_row(lane, i), mma_b_col(lane, i)};
  return e;
}
std::array<RowCol, 4> c_elements(int lane) {
  std::array<RowCol, 4> e;
  for (int i = 0; i < 4; ++i) e[size_t(i)] = {mma_c_row(lane, i), mma_c_col(lane, i)};
  return e;
}

// PTX ISA, mma.m16n8k16 .bf16: groupID = lane >> 2, threadID_in_group = lane % 4. A: row groupID
// for a0, a1, a4, a5, else groupID + 8; col 2 tig + (i & 1), plus 8 for i >= 4. B: row 2 tig +
// (i & 1), plus 8 for i >= 2; col groupID. C: row groupID for c0, c1, else groupID + 8; col 2
// tig + (i & 1).
TEST(MmaFragment, ElementsOfLanes0And5And31AreThoseOfThePtxIsa) {
  EXPECT_EQ(
      a_elements(0),
      (std::array<RowCol, 8>{{{0, 0}, {0, 1}, {8, 0}, {8, 1}, {0, 8}, {0, 9}, {8, 8}, {8, 9}}}));
  EXPECT_EQ(a_elements(5),
            (std::array<RowCol, 8>{
                {{1, 2}, {1, 3}, {9, 2}, {9, 3}, {1, 10}, {1, 11}, {9, 10}, {9, 11}}}));
  EXPECT_EQ(a_elements(31),
            (std::array<RowCol, 8>{
                {{7, 6}, {7, 7}, {15, 6}, {15, 7}, {7, 14}, {7, 15}, {15, 14}, {15, 15}}}));
  EXPECT_EQ(b_elements(0), (std::array<RowCol, 4>{{{0, 0}, {1, 0}, {8, 0}, {9, 0}}}));
  EXPECT_EQ(b_elements(5), (std::array<RowCol, 4>{{{2, 1}, {3, 1}, {10, 1}, {11, 1}}}));
  EXPECT_EQ(b_elements(31), (std::array<RowCol, 4>{{{6, 7}, {7, 7}, {14, 7}, {15, 7}}}));
  EXPECT_EQ(c_elements(0), (std::array<RowCol, 4>{{{0, 0}, {0, 1}, {8, 0}, {8, 1}}}));
  EXPECT_EQ(c_elements(5), (std::array<RowCol, 4>{{{1, 2}, {1, 3}, {9, 2}, {9, 3}}}));
  EXPECT_EQ(c_elements(31), (std::array<RowCol, 4>{{{7, 6}, {7, 7}, {15, 6}, {15, 7}}}));
}

// Each fragment is a one-to-one map of (lane, element) onto the matrix.
TEST(MmaFragment, EveryElementOfABAndCHasExactlyOneOwner) {
  std::vector<int> a(kMmaM * kMmaK, 0), b(kMmaK * kMmaN, 0), c(kMmaM * kMmaN, 0);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (const RowCol& e : a_elements(lane)) ++a[size_t(e.first * kMmaK + e.second)];
    for (const RowCol& e : b_elements(lane)) ++b[size_t(e.first * kMmaN + e.second)];
    for (const RowCol& e : c_elements(lane)) ++c[size_t(e.first * kMmaN + e.second)];
  }
  for (int n : a) EXPECT_EQ(n, 1);
  for (int n : b) EXPECT_EQ(n, 1);
  for (int n : c) EXPECT_EQ(n, 1);
}

// A lane's C elements of n-blocks 2j and 2j + 1 (columns 0-7 and 8-15 of a 16 x 16 product)
// are the same matrix positions as its A elements, in the order mma_a_from_c_* gives.
TEST(MmaFragment, TwoCFragmentsAreTheAFragmentOfTheSixteenColumns) {
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int i = 0; i < kMmaAElements; ++i) {
      const int block = mma_a_from_c_block(i), element = mma_a_from_c_element(i);
      ASSERT_GE(block, 0);
      ASSERT_LE(block, 1);
      EXPECT_EQ(mma_a_row(lane, i), mma_c_row(lane, element)) << "lane " << lane << " a" << i;
      EXPECT_EQ(mma_a_col(lane, i), block * kMmaN + mma_c_col(lane, element))
          << "lane " << lane << " a" << i;
    }
  }
}

// A row of C lives in the 4 lanes of a quad: lane ^ 1 and lane ^ 2 (the shuffle masks of the
// kernel's row reductions) reach all of them and no other lane.
TEST(MmaFragment, TheRowReductionMasksStayWithinTheRowsQuad) {
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int mask = 1; mask <= 3; ++mask) {
      const int other = lane ^ mask;
      EXPECT_EQ(mma_group(other), mma_group(lane));
      EXPECT_EQ(mma_c_row(other, 0), mma_c_row(lane, 0));
      EXPECT_EQ(mma_c_row(other, 2), mma_c_row(lane, 2));
    }
  }
}

TEST(MmaFragment, Bf16PairsPutTheLowerIndexInTheLowHalf) {
  const uint32_t pair = pack_bf16_pair(0x3F80u, 0xC000u);  // 1.0, -2.0
  EXPECT_EQ(pair, 0xC0003F80u);
  EXPECT_EQ(bf16_pair_low(pair), 0x3F80u);
  EXPECT_EQ(bf16_pair_high(pair), 0xC000u);
}

}  // namespace
}  // namespace gnmr
