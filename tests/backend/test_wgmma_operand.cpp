// src/backend/wgmma_operand.h: the descriptor's bit fields, and every operand the flash
// forward's wgmma kernel hands the instruction, read back element by element through the
// descriptor's definition (wgmma_operand_byte, what the CUDA emulation reads), against the
// row-major tile it means.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/flash_layout.h"
#include "backend/wgmma_operand.h"

namespace gnmr {
namespace {

TEST(WgmmaOperand, DescriptorFieldsSitWhereThePtxIsaPutsThem) {
  const uint64_t d = wgmma_descriptor(0x3FFF0, 0x1230, 0x2340);
  EXPECT_EQ(d & 0x3FFFu, 0x3FFFu);         // bits 0-13: start >> 4
  EXPECT_EQ((d >> 14) & 0x3u, 0u);         // 14-15 unused
  EXPECT_EQ((d >> 16) & 0x3FFFu, 0x123u);  // 16-29: LBO >> 4
  EXPECT_EQ((d >> 30) & 0x3u, 0u);         // 30-31 unused
  EXPECT_EQ((d >> 32) & 0x3FFFu, 0x234u);  // 32-45: SBO >> 4
  EXPECT_EQ(d >> 46, 0u);                  // base offset 0, no swizzle
  EXPECT_EQ(wgmma_descriptor_start(d), 0x3FFF0u);
  EXPECT_EQ(wgmma_descriptor_lbo(d), 0x1230u);
  EXPECT_EQ(wgmma_descriptor_sbo(d), 0x2340u);
  EXPECT_EQ(wgmma_descriptor_base_offset(d), 0u);
  EXPECT_EQ(wgmma_descriptor_swizzle(d), 0u);
  EXPECT_EQ(wgmma_descriptor_swizzle(d | (uint64_t{1} << 62)), 1u);
  EXPECT_EQ(wgmma_descriptor_base_offset(d | (uint64_t{5} << 49)), 5u);
}

// The PTX ISA's own layouts (§9.7.15.5.1.2.1.3, "Canonical Layouts"), written here as printed
// and not through this file's formulas, so that a misreading shared by the kernels, the
// emulation and the tests above would fail here. CuTe layouts, in bf16 elements (T = 8 per
// 16 bytes): Figure 168, MN-major without swizzle, ((8,1,2),(8,2)):((1,8,64),(8,128)) with
// LBO = 128 and SBO = 64 elements; the K-major canonical form ((8,m),(T,2k)):((1T,SBO),(1,LBO)).
TEST(WgmmaOperand, ThePtxIsasWorkedLayoutsAreReadAsPrinted) {
  const uint32_t start = 512;
  const uint64_t figure_168 = wgmma_descriptor(start, 128 * 2, 64 * 2);
  for (int mn = 0; mn < 16; ++mn) {
    for (int k = 0; k < 16; ++k) {
      const int element = (mn % 8) * 1 + (mn / 8) * 64 + (k % 8) * 8 + (k / 8) * 128;
      EXPECT_EQ(wgmma_operand_byte(figure_168, /*mn_major=*/true, mn, k), start + 2u * element)
          << "MN-major (" << mn << ", " << k << ")";
    }
  }
  const int lbo = 64, sbo = 256;  // elements, as the scores' operands: any multiples of 8 do
  const uint64_t k_major = wgmma_descriptor(start, 2 * lbo, 2 * sbo);
  for (int mn = 0; mn < 24; ++mn) {
    for (int k = 0; k < 32; ++k) {
      const int element = (mn % 8) * 8 + (mn / 8) * sbo + (k % 8) * 1 + (k / 8) * lbo;
      EXPECT_EQ(wgmma_operand_byte(k_major, /*mn_major=*/false, mn, k), start + 2u * element)
          << "K-major (" << mn << ", " << k << ")";
    }
  }
}

TEST(WgmmaOperand, AnAdvancedDescriptorIsTheDescriptorOfTheLaterStart) {
  for (const uint32_t start : {0u, 16u, 4096u, 0x30000u}) {
    for (const uint32_t bytes : {0u, 16u, 256u, 2048u, 0xC000u}) {
      EXPECT_EQ(wgmma_descriptor_advanced(wgmma_descriptor(start, 128, 2048), bytes),
                wgmma_descriptor(start + bytes, 128, 2048))
          << start << " + " << bytes;
    }
  }
}

TEST(WgmmaOperand, CoreMatricesAreEightRowsOfSixteenContiguousBytes) {
  const uint64_t d = wgmma_descriptor(256, 1024, 128);
  // K-major: a row of the core matrix runs along K.
  EXPECT_EQ(wgmma_operand_byte(d, false, 0, 1), 258u);
  EXPECT_EQ(wgmma_operand_byte(d, false, 1, 0), 272u);
  EXPECT_EQ(wgmma_operand_byte(d, false, 8, 0), 256u + 128u);   // SBO along M / N
  EXPECT_EQ(wgmma_operand_byte(d, false, 0, 8), 256u + 1024u);  // LBO along K
  // MN-major: a row runs along M / N.
  EXPECT_EQ(wgmma_operand_byte(d, true, 1, 0), 258u);
  EXPECT_EQ(wgmma_operand_byte(d, true, 0, 1), 272u);
  EXPECT_EQ(wgmma_operand_byte(d, true, 8, 0), 256u + 128u);
  EXPECT_EQ(wgmma_operand_byte(d, true, 0, 8), 256u + 1024u);
}

// A rows x head_dim tile whose element (row, col) is row * head_dim + col, placed by
// wgmma_tile_element at byte `base` of a shared memory image.
struct PlacedTile {
  int head_dim;
  uint32_t base;
  std::vector<int32_t> image;  // per bf16 slot: the element it holds, -1 none
  PlacedTile(int hd, uint32_t at, int rows = kWgmmaM)
      : head_dim(hd), base(at), image((at + uint32_t(rows * hd * 2)) / 2, -1) {
    for (int row = 0; row < rows; ++row) {
      for (int col = 0; col < hd; ++col) {
        int32_t& slot = image[base / 2 + size_t(wgmma_tile_element(row, col, hd))];
        EXPECT_EQ(slot, -1) << "row " << row << " col " << col << " shares a slot";
        slot = row * hd + col;
      }
    }
  }
  int32_t at(uint32_t byte) const {
    EXPECT_EQ(byte % 2, 0u);
    return byte / 2 < image.size() ? image[byte / 2] : -2;
  }
};

TEST(WgmmaOperand, TheTileLayoutFillsItsBytesOnceAndKeepsChunksContiguous) {
  for (const int hd : {64, 128}) {
    for (const int tile_rows : {64, 128}) {
      std::vector<int> seen(size_t(tile_rows * hd), 0);
      for (int row = 0; row < tile_rows; ++row) {
        for (int col = 0; col < hd; ++col) {
          const int e = wgmma_tile_element(row, col, hd);
          ASSERT_GE(e, 0);
          ASSERT_LT(e, tile_rows * hd);
          ++seen[size_t(e)];
          // cp.async copies 16 bytes of a row: 8 columns from a multiple of 8, contiguous.
          if (col % 8 != 0) {
            EXPECT_EQ(e, wgmma_tile_element(row, col - 1, hd) + 1);
          }
        }
      }
      for (const int n : seen) ASSERT_EQ(n, 1);
      EXPECT_EQ(wgmma_tile_bytes(tile_rows, hd), tile_rows * hd * 2);
      const FlashWgmmaSharedLayout l = flash_wgmma_shared_layout(hd, tile_rows);
      EXPECT_EQ(l.k - l.q, wgmma_tile_bytes(tile_rows, hd));
      EXPECT_EQ(l.v - l.k, wgmma_tile_bytes(64, hd));
      EXPECT_EQ(l.total_bytes - l.v, wgmma_tile_bytes(64, hd));
    }
  }
  static_assert(kWgmmaM == kFlashQTile && kWgmmaN == kFlashKvTile,
                "the wgmma forward's tiles are the flash tiling's");
}

TEST(WgmmaOperand, TheKeyValuePassesRegionsAreDisjointAndAligned) {
  for (const int hd : {64, 128}) {
    const FlashWgmmaKeyValueLayout l = flash_wgmma_key_value_layout(hd);
    const int tile = wgmma_tile_bytes(64, hd), rows = 64 * 4;
    // [start, end) of K, V, and each stage's q, dout, lse, delta.
    std::vector<std::pair<int, int>> regions = {{l.k, l.k + tile}, {l.v, l.v + tile}};
    for (int stage = 0; stage < 2; ++stage) {
      const int at = stage * l.stage_bytes;
      regions.push_back({l.q + at, l.q + at + tile});
      regions.push_back({l.dout + at, l.dout + at + tile});
      regions.push_back({l.lse + at, l.lse + at + rows});
      regions.push_back({l.delta + at, l.delta + at + rows});
    }
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(regions[i].first % 16, 0) << "region " << i << " off a 16-byte boundary";
      EXPECT_GE(regions[i].first, 0);
      EXPECT_LE(regions[i].second, l.total_bytes) << "region " << i;
      for (size_t j = 0; j < i; ++j) {
        EXPECT_TRUE(regions[i].second <= regions[j].first || regions[j].second <= regions[i].first)
            << "regions " << j << " and " << i << " overlap";
      }
    }
    EXPECT_LE(l.total_bytes, 227 * 1024 / 2) << "two blocks a multiprocessor";
  }
}

// S = Q K^T's operands: at k-step kk, A(m, k) = Q[m][16 kk + k] and B^T(n, k) = K[n][16 kk + k],
// both K-major, for every m / n of the 64 rows; and the second slab of a 128-row query tile
// (the kernel's descriptor advanced by a 64-row tile's bytes), A(m, k) = Q[64 + m][16 kk + k].
TEST(WgmmaOperand, ScoreOperandsAreTheTilesSixteenColumnBlocks) {
  for (const int hd : {64, 128}) {
    SCOPED_TRACE("hd " + std::to_string(hd));
    const PlacedTile tile(hd, 3 * 64 * hd * 2, 128);  // a tile not at address 0
    for (int slab = 0; slab < 2; ++slab) {
      const uint64_t operand = wgmma_descriptor_advanced(wgmma_scores_operand(tile.base, hd),
                                                         uint32_t(slab * wgmma_tile_bytes(64, hd)));
      for (int kk = 0; kk < hd / kWgmmaK; ++kk) {
        const uint64_t d = wgmma_scores_step(operand, kk);
        for (int mn = 0; mn < 64; ++mn) {
          for (int k = 0; k < kWgmmaK; ++k) {
            ASSERT_EQ(tile.at(wgmma_operand_byte(d, false, mn, k)),
                      (64 * slab + mn) * hd + 16 * kk + k)
                << "slab " << slab << " kk " << kk << " row " << mn << " k " << k;
          }
        }
      }
    }
  }
}

// O += P V's B operand: at k-step kk and output half h, B(k, n) = V[16 kk + k][64 h + n],
// MN-major.
TEST(WgmmaOperand, ValueOperandsAreTheTilesSixteenRowBlocks) {
  for (const int hd : {64, 128}) {
    SCOPED_TRACE("hd " + std::to_string(hd));
    const PlacedTile tile(hd, 2 * 64 * hd * 2);
    for (int kk = 0; kk < 64 / kWgmmaK; ++kk) {
      for (int h = 0; h < hd / kWgmmaN; ++h) {
        const uint64_t d = wgmma_values_step(wgmma_values_operand(tile.base, hd), kk, h, hd);
        for (int k = 0; k < kWgmmaK; ++k) {
          for (int n = 0; n < kWgmmaN; ++n) {
            ASSERT_EQ(tile.at(wgmma_operand_byte(d, true, n, k)), (16 * kk + k) * hd + 64 * h + n)
                << "kk " << kk << " h " << h << " k " << k << " n " << n;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gnmr
