// The mma.sync m16n8k16 fragment rules (src/backend/mma_fragment.h) against the PTX ISA's
// formulas, written out here by hand for a few lanes, and the properties the tensor-core kernel
// relies on: every element of A, B and C held by exactly one (lane, element), and a product's C
// fragments reusable as the next product's A fragment. Then ldmatrix: its delivery rule against
// the ISA, and the kernel's row addresses, run through that rule on a tile laid out as the
// kernel's shared memory (src/backend/flash_layout.h), giving exactly the mma fragments the
// scalar loads by mma_a_* / mma_b_* would, with no bank conflict.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/flash_layout.h"
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

// PTX ISA, ldmatrix .m8n8 .b16: "each thread in a warp holds two consecutive elements of a row"
// (row lane / 4, columns 2 (lane % 4) + 0, 1); with .trans the matrix is read column-major, so a
// thread holds rows 2 (lane % 4) + 0, 1 of column lane / 4.
TEST(Ldmatrix, ElementsOfLanes0And5And31AreThoseOfThePtxIsa) {
  const auto held = [](int lane, bool trans) {
    return std::array<RowCol, 2>{
        {{ldmatrix_element_row(lane, 0, trans), ldmatrix_element_col(lane, 0, trans)},
         {ldmatrix_element_row(lane, 1, trans), ldmatrix_element_col(lane, 1, trans)}}};
  };
  EXPECT_EQ(held(0, false), (std::array<RowCol, 2>{{{0, 0}, {0, 1}}}));
  EXPECT_EQ(held(5, false), (std::array<RowCol, 2>{{{1, 2}, {1, 3}}}));
  EXPECT_EQ(held(31, false), (std::array<RowCol, 2>{{{7, 6}, {7, 7}}}));
  EXPECT_EQ(held(0, true), (std::array<RowCol, 2>{{{0, 0}, {1, 0}}}));
  EXPECT_EQ(held(5, true), (std::array<RowCol, 2>{{{2, 1}, {3, 1}}}));
  EXPECT_EQ(held(31, true), (std::array<RowCol, 2>{{{6, 7}, {7, 7}}}));
  // Lanes 8j..8j + 7 hand in rows 0..7 of matrix j.
  EXPECT_EQ(ldmatrix_address_matrix(13), 1);
  EXPECT_EQ(ldmatrix_address_row(13), 5);
  EXPECT_EQ(ldmatrix_address_matrix(31), 3);
  EXPECT_EQ(ldmatrix_address_row(31), 7);
}

// One register over the 32 lanes is the whole 8 x 8 matrix, each element once.
TEST(Ldmatrix, EachRegisterHoldsEveryElementOfItsMatrixOnce) {
  for (bool trans : {false, true}) {
    std::vector<int> seen(kLdmatrixRows * kLdmatrixRows, 0);
    for (int lane = 0; lane < kWarpSize; ++lane) {
      for (int half = 0; half < 2; ++half) {
        ++seen[size_t(ldmatrix_element_row(lane, half, trans) * kLdmatrixRows +
                      ldmatrix_element_col(lane, half, trans))];
      }
    }
    for (int n : seen) EXPECT_EQ(n, 1) << "trans " << trans;
  }
}

// What ldmatrix.x4 delivers when lane l hands in the address of element (row(l), col(l)) of a
// row-major bf16 tile, by the ISA's rule above.
template <typename Row, typename Col>
std::array<std::array<uint32_t, 4>, kWarpSize> ldmatrix_x4(const std::vector<uint16_t>& tile,
                                                           int64_t stride, Row row, Col col,
                                                           bool trans) {
  std::array<std::array<uint32_t, 4>, kWarpSize> r{};
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int j = 0; j < kLdmatrixMatrices; ++j) {
      uint16_t half_value[2];
      for (int half = 0; half < 2; ++half) {
        // The address lane 8j + (element row) handed in is that row of matrix j.
        const int provider = kLdmatrixRows * j + ldmatrix_element_row(lane, half, trans);
        half_value[half] = tile[size_t(row(provider) * stride + col(provider) +
                                       ldmatrix_element_col(lane, half, trans))];
      }
      r[size_t(lane)][size_t(j)] = pack_bf16_pair(half_value[0], half_value[1]);
    }
  }
  return r;
}

// A tile as the kernel keeps one (64 rows of head dim 128 plus the padding), every element a
// distinct code.
struct KernelTile {
  int64_t stride = int64_t(128) + 8;
  std::vector<uint16_t> codes;
  KernelTile() : codes(size_t(64 * stride)) {
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint16_t(i * 7919u);
  }
  uint16_t at(int64_t r, int64_t c) const { return codes[size_t(r * stride + c)]; }
};

TEST(Ldmatrix, TheKernelsAddressesLoadTheAFragment) {
  const KernelTile t;
  const int64_t r0 = 16, c0 = 48;  // the block: rows r0.., columns c0..
  const auto got = ldmatrix_x4(
      t.codes, t.stride, [&](int l) { return r0 + ldmatrix_a_row(l); },
      [&](int l) { return c0 + ldmatrix_a_col(l); }, false);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int r = 0; r < 4; ++r) {
      const uint32_t want =
          pack_bf16_pair(t.at(r0 + mma_a_row(lane, 2 * r), c0 + mma_a_col(lane, 2 * r)),
                         t.at(r0 + mma_a_row(lane, 2 * r + 1), c0 + mma_a_col(lane, 2 * r + 1)));
      EXPECT_EQ(got[size_t(lane)][size_t(r)], want) << "lane " << lane << " register " << r;
    }
  }
}

// B (k x n) fragments of n-blocks 0 and 1 from rows that are n: B(k, n) = tile(n0 + n, k0 + k).
TEST(Ldmatrix, TheKernelsAddressesLoadTwoBFragmentsFromNRows) {
  const KernelTile t;
  const int64_t n0 = 24, k0 = 112;
  const auto got = ldmatrix_x4(
      t.codes, t.stride, [&](int l) { return n0 + ldmatrix_b_n_rows_row(l); },
      [&](int l) { return k0 + ldmatrix_b_n_rows_col(l); }, false);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int nb = 0; nb < 2; ++nb) {
      for (int r = 0; r < 2; ++r) {
        const auto b = [&](int i) {
          return t.at(n0 + nb * kMmaN + mma_b_col(lane, i), k0 + mma_b_row(lane, i));
        };
        EXPECT_EQ(got[size_t(lane)][size_t(2 * nb + r)], pack_bf16_pair(b(2 * r), b(2 * r + 1)))
            << "lane " << lane << " n-block " << nb << " register " << r;
      }
    }
  }
}

// With .trans, from rows that are k: B(k, n) = tile(k0 + k, n0 + n).
TEST(Ldmatrix, TheKernelsAddressesLoadTwoBFragmentsFromKRowsTransposed) {
  const KernelTile t;
  const int64_t k0 = 32, n0 = 56;
  const auto got = ldmatrix_x4(
      t.codes, t.stride, [&](int l) { return k0 + ldmatrix_a_row(l); },
      [&](int l) { return n0 + ldmatrix_a_col(l); }, true);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int nb = 0; nb < 2; ++nb) {
      for (int r = 0; r < 2; ++r) {
        const auto b = [&](int i) {
          return t.at(k0 + mma_b_row(lane, i), n0 + nb * kMmaN + mma_b_col(lane, i));
        };
        EXPECT_EQ(got[size_t(lane)][size_t(2 * nb + r)], pack_bf16_pair(b(2 * r), b(2 * r + 1)))
            << "lane " << lane << " n-block " << nb << " register " << r;
      }
    }
  }
}

// ldmatrix reads each matrix's 8 rows of 16 bytes in one pass of shared memory: with the
// kernel's row stride (head_dim + 8 bf16) and the kernel's addresses, those 8 rows start 16-byte
// aligned and fall on 32 different 4-byte banks, for every block the kernels load.
TEST(Ldmatrix, TheKernelsAddressesAreAlignedAndFreeOfBankConflicts) {
  for (int64_t hd : {64, 128}) {
    const int64_t stride =
        flash_mma_shared_layout(FlashKernel::Forward, hd, flash_gpu_tiling(64)).row_stride;
    for (int pattern = 0; pattern < 2; ++pattern) {
      for (int64_t r0 = 0; r0 < kFlashQTile; r0 += kMmaM) {
        for (int64_t c0 = 0; c0 < hd; c0 += kMmaK) {
          for (int j = 0; j < kLdmatrixMatrices; ++j) {
            std::vector<int> bank_uses(32, 0);
            for (int row = 0; row < kLdmatrixRows; ++row) {
              const int lane = kLdmatrixRows * j + row;
              const int64_t r =
                  r0 + (pattern == 0 ? ldmatrix_a_row(lane) : ldmatrix_b_n_rows_row(lane));
              const int64_t c =
                  c0 + (pattern == 0 ? ldmatrix_a_col(lane) : ldmatrix_b_n_rows_col(lane));
              const int64_t byte = 2 * (r * stride + c);
              ASSERT_EQ(byte % 16, 0) << "hd " << hd << " lane " << lane;
              for (int64_t word = byte / 4; word < byte / 4 + 4; ++word)
                ++bank_uses[size_t(word % 32)];
            }
            for (int uses : bank_uses) {
              ASSERT_EQ(uses, 1) << "hd " << hd << " pattern " << pattern << " block (" << r0
                                 << ", " << c0 << ") matrix " << j;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gnmr
