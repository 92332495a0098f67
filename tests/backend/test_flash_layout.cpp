// The flash-attention kernels' launch shape (src/backend/flash_layout.h), checked on the host:
// the shared-memory tiles do not overlap and fit the sm_80 / sm_90 per-block limit, the padded
// strides spread a column over 32 banks, every register-tile element has one owner, and the
// grids have one block per tile the CPU twin (cpu/flash_attention.cpp) loops over.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/flash_layout.h"

namespace gnmr {
namespace {

// cudaDevAttrMaxSharedMemoryPerBlockOptin: 163 KiB on A100 (sm_80), 227 KiB on H100 / H200.
constexpr int64_t kSm80SharedOptinBytes = 163 * 1024;

TEST(FlashLayout, TilesDoNotOverlapAndFitAnSm80Block) {
  for (int64_t hd : {64, 128}) {
    for (FlashKernel kernel :
         {FlashKernel::Forward, FlashKernel::BackwardKeyValue, FlashKernel::BackwardQuery}) {
      SCOPED_TRACE(::testing::Message() << "hd " << hd << " kernel " << int(kernel));
      const FlashTiling t = flash_gpu_tiling(1000);
      const FlashSharedLayout l = flash_shared_layout(kernel, hd, t);
      const bool backward = kernel != FlashKernel::Forward;
      std::vector<std::pair<int64_t, int64_t>> regions = {{l.q, t.q_tile * l.row_stride},
                                                          {l.k, t.kv_tile * l.kv_stride},
                                                          {l.v, t.kv_tile * l.kv_stride},
                                                          {l.s, t.q_tile * l.score_stride},
                                                          {l.row_a, t.q_tile},
                                                          {l.row_b, t.q_tile},
                                                          {l.row_c, t.q_tile}};
      if (backward) {
        regions.push_back({l.dout, t.q_tile * l.row_stride});
        regions.push_back({l.ds, t.q_tile * l.score_stride});
      }
      std::sort(regions.begin(), regions.end());
      for (size_t i = 0; i + 1 < regions.size(); ++i) {
        EXPECT_LE(regions[i].first + regions[i].second, regions[i + 1].first);
      }
      EXPECT_LE(regions.back().first + regions.back().second, l.total_floats);
      EXPECT_LE(flash_shared_bytes(kernel, hd, t), kSm80SharedOptinBytes);
      // One float of padding: rows kv_stride (or score_stride) apart start one bank later.
      EXPECT_EQ(l.kv_stride % 32, 1);
      EXPECT_EQ(l.score_stride % 32, 1);
    }
  }
}

// The tensor-core kernels' layout: bf16 tiles (in 2-byte elements) then, for the dK/dV pass,
// the lse and delta rows (in 4-byte floats) after them, its per-query-tile data in two stages;
// no overlap, within an sm_80 block, rows 16-byte aligned and 4 banks apart (so 8 rows x 4
// words of a fragment load hit 32 banks), every region 16-byte aligned (the dK/dV pass reads
// lse and delta a lane's column pair at a time, 8-byte loads).
TEST(FlashLayout, TensorCoreTilesDoNotOverlapAndFitAnSm80Block) {
  for (int64_t hd : {64, 128}) {
    for (FlashKernel kernel :
         {FlashKernel::Forward, FlashKernel::BackwardKeyValue, FlashKernel::BackwardQuery}) {
      for (const int64_t query_tile : {kFlashQTile, 2 * kFlashQTile}) {
        if (query_tile != kFlashQTile && kernel != FlashKernel::Forward) continue;  // forward only
        SCOPED_TRACE(::testing::Message()
                     << "hd " << hd << " kernel " << int(kernel) << " query tile " << query_tile);
        const FlashTiling t = flash_mma_query_tiling(1000, query_tile);
        const FlashMmaSharedLayout l = flash_mma_shared_layout(kernel, hd, t);
        // Byte ranges of every region.
        std::vector<std::pair<int64_t, int64_t>> regions = {
            {2 * l.q, 2 * t.q_tile * l.row_stride},
            {2 * l.k, 2 * t.kv_tile * l.row_stride},
            {2 * l.v, 2 * t.kv_tile * l.row_stride}};
        if (kernel != FlashKernel::Forward) {
          regions.push_back({2 * l.dout, 2 * t.q_tile * l.row_stride});
        }
        if (kernel == FlashKernel::BackwardKeyValue) {
          // Two stages of q, dout, lse and delta.
          ASSERT_GT(l.stage_elements, 0);
          ASSERT_GT(l.stage_floats, 0);
          regions.push_back({2 * (l.q + l.stage_elements), 2 * t.q_tile * l.row_stride});
          regions.push_back({2 * (l.dout + l.stage_elements), 2 * t.q_tile * l.row_stride});
          for (int64_t stage = 0; stage < 2; ++stage) {
            regions.push_back({4 * (l.lse + stage * l.stage_floats), 4 * t.q_tile});
            regions.push_back({4 * (l.delta + stage * l.stage_floats), 4 * t.q_tile});
          }
        } else {
          EXPECT_EQ(l.stage_elements, 0);
        }
        std::sort(regions.begin(), regions.end());
        for (size_t i = 0; i + 1 < regions.size(); ++i) {
          EXPECT_LE(regions[i].first + regions[i].second, regions[i + 1].first);
        }
        EXPECT_LE(regions.back().first + regions.back().second, l.total_bytes);
        EXPECT_EQ(flash_mma_shared_bytes(kernel, hd, t), l.total_bytes);
        EXPECT_LE(l.total_bytes, kSm80SharedOptinBytes);
        for (const auto& region : regions) EXPECT_EQ(region.first % 16, 0);
        EXPECT_EQ(2 * l.row_stride % 16, 0);
        EXPECT_EQ(2 * l.row_stride / 4 % 32, 4);
      }
    }
  }
}

TEST(FlashLayout, EveryRegisterTileElementHasOneOwner) {
  for (int64_t hd : {64, 128}) {
    const int64_t owned = flash_owned_per_thread(hd);
    std::vector<int> owners(size_t(kFlashQTile * hd), 0);
    for (int64_t thread = 0; thread < kFlashThreads; ++thread) {
      for (int64_t a = 0; a < owned; ++a) ++owners[size_t(thread + a * kFlashThreads)];
    }
    EXPECT_EQ(owned * kFlashThreads, kFlashQTile * hd);
    EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }));
  }
}

TEST(FlashLayout, GridsHaveOneBlockPerTileTask) {
  for (int64_t seq : {1, 17, 63, 64, 65, 128, 1000, 4096}) {
    const FlashTiling t = flash_gpu_tiling(seq);
    const int64_t q_tiles = (seq + 63) / 64;
    EXPECT_EQ(flash_grid_blocks(FlashKernel::Forward, 8, 32, 8, t), 8 * 32 * q_tiles);
    EXPECT_EQ(flash_grid_blocks(FlashKernel::BackwardQuery, 8, 32, 8, t), 8 * 32 * q_tiles);
    EXPECT_EQ(flash_grid_blocks(FlashKernel::BackwardKeyValue, 8, 32, 8, t), 8 * 8 * q_tiles);
    EXPECT_EQ(flash_backward_scratch_floats(8, 32, seq), 8 * 32 * seq);
  }
}

// Every block of a grid has its own (batch, head, tile), together all of them, a head's blocks
// consecutive with the longest first (the tile pairs it visits under the causal mask), and a
// query head reads kv head head / (heads / kv_heads).
TEST(FlashLayout, EveryTileTaskHasOneBlockAndAHeadsLongestStartFirst) {
  for (int64_t seq : {1, 17, 64, 65, 1000}) {
    for (const int64_t query_tile : {kFlashQTile, 2 * kFlashQTile}) {  // 128: the forward's only
      const FlashTiling t = flash_mma_query_tiling(seq, query_tile);
      const FlashDims s{3, seq, 8, 2};
      for (FlashKernel kernel :
           {FlashKernel::Forward, FlashKernel::BackwardKeyValue, FlashKernel::BackwardQuery}) {
        if (query_tile != kFlashQTile && kernel != FlashKernel::Forward) continue;
        SCOPED_TRACE(::testing::Message()
                     << "T=" << seq << " kernel " << int(kernel) << " query tile " << query_tile);
        const bool per_key_tile = kernel == FlashKernel::BackwardKeyValue;
        const int64_t heads = per_key_tile ? s.kv_heads : s.heads;
        const int64_t tiles = per_key_tile ? flash_kv_tiles(t) : flash_q_tiles(t);
        const auto pairs = [&](int64_t tile) {  // the tile pairs a task visits
          return per_key_tile ? flash_q_tiles(t) - flash_first_q_tile(t, tile)
                              : flash_last_kv_tile(t, tile) + 1;
        };
        const int64_t blocks = flash_grid_blocks(kernel, s.batch, s.heads, s.kv_heads, t);
        ASSERT_EQ(blocks, s.batch * heads * tiles);
        std::vector<int> seen(size_t(blocks), 0);
        for (int64_t block = 0; block < blocks; ++block) {
          const FlashBlockTask task = flash_block_task(kernel, uint32_t(block), s, t);
          ASSERT_TRUE(task.batch >= 0 && task.batch < s.batch && task.head >= 0 &&
                      task.head < heads && task.tile >= 0 && task.tile < tiles)
              << "block " << block;
          ++seen[size_t((task.batch * heads + task.head) * tiles + task.tile)];
          EXPECT_EQ(task.kv_head, per_key_tile ? task.head : task.head / (s.heads / s.kv_heads));
          EXPECT_EQ(task.batch * heads + task.head, block / tiles) << "a head's blocks together";
          if (block % tiles != 0) {
            const FlashBlockTask before = flash_block_task(kernel, uint32_t(block - 1), s, t);
            EXPECT_LE(pairs(task.tile), pairs(before.tile)) << "block " << block;
          }
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        // The longest first: a head's first block takes the tile with the most pairs.
        if (tiles > 1) {
          const FlashBlockTask first = flash_block_task(kernel, 0, s, t);
          EXPECT_EQ(pairs(first.tile), per_key_tile ? flash_q_tiles(t) : flash_kv_tiles(t));
        }
      }
    }
  }
}

// A warp of the tensor-core forward skips a key tile only where every score it owns there is
// masked (a key after its query, or a query past the end), and never skips key tile 0, which
// gives every row a finite running max; at 128 rows the first half's warps do skip their last
// key tile.
TEST(FlashLayout, TheForwardsWarpsSkipOnlyKeyTilesWhoseScoresAreAllMasked) {
  for (const int64_t query_tile : {kFlashQTile, 2 * kFlashQTile}) {
    const int64_t warp_rows = query_tile / kFlashMmaWarps;
    int64_t skipped = 0;
    for (int64_t seq = 1; seq <= 300; ++seq) {
      const FlashTiling t = flash_mma_query_tiling(seq, query_tile);
      for (int64_t qi = 0; qi < flash_q_tiles(t); ++qi) {
        const int64_t r0 = qi * query_tile, rows = flash_tile_rows(qi, query_tile, seq);
        for (int64_t kj = 0; kj <= flash_last_kv_tile(t, qi); ++kj) {
          const int64_t c0 = kj * t.kv_tile;
          for (int64_t warp = 0; warp < kFlashMmaWarps; ++warp) {
            const int64_t w0 = warp * warp_rows;
            const bool sees = flash_mma_warp_sees_key_tile(c0, r0 + w0 + warp_rows - 1, w0 < rows);
            bool any_visible = false;
            for (int64_t i = r0 + w0; i < r0 + w0 + warp_rows && i < seq; ++i) {
              for (int64_t j = c0; j < c0 + t.kv_tile && j < seq; ++j) any_visible |= j <= i;
            }
            ASSERT_TRUE(sees || !any_visible)
                << "tile " << query_tile << " T=" << seq << " qi " << qi << " kj " << kj << " warp "
                << warp << " skips a visible score";
            if (kj == 0 && w0 < rows) {
              ASSERT_TRUE(sees) << "key tile 0 skipped";
            }
            skipped += !sees && w0 < rows;
          }
        }
      }
    }
    if (query_tile == 2 * kFlashQTile) {
      EXPECT_GT(skipped, 0);
    } else {
      EXPECT_EQ(skipped, 0) << "64-row tiles: every warp sees every tile it visits";
    }
  }
}

// The tensor-core kernels' two buffers: the inputs, bf16 q ([B, T, H, hd]), k and v
// ([B, T, Hkv, hd]); the backward's scratch, bf16 dout ([B, T, H, hd]) and the fp32 delta
// ([B, H, T]). Each one's regions one after another without overlap, each 256-byte aligned (so
// every row the kernels copy 16 bytes at a time is aligned), nothing wasted beyond the padding.
TEST(FlashLayout, TensorCoreBuffersHoldEveryCopyAlignedWithoutOverlap) {
  for (const FlashDims& s : {FlashDims{1, 1, 1, 1}, FlashDims{2, 17, 8, 2},
                             FlashDims{3, 1000, 6, 3}, FlashDims{8, 1024, 32, 32}}) {
    for (int64_t hd : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.batch << " T=" << s.seq << " H=" << s.heads
                                        << " Hkv=" << s.kv_heads << " hd=" << hd);
      const FlashMmaBuffers l = flash_mma_buffers(s, hd);
      const int64_t q_bytes = 2 * s.batch * s.seq * s.heads * hd;
      const int64_t kv_bytes = 2 * s.batch * s.seq * s.kv_heads * hd;
      using Regions = std::vector<std::pair<int64_t, int64_t>>;
      const Regions inputs = {{l.q, q_bytes}, {l.k, kv_bytes}, {l.v, kv_bytes}};
      const Regions scratch = {
          {l.dout, q_bytes}, {l.delta, 4 * flash_backward_scratch_floats(s.batch, s.heads, s.seq)}};
      for (const auto& [regions, total] :
           {std::pair<Regions, int64_t>{inputs, l.inputs_bytes}, {scratch, l.scratch_bytes}}) {
        int64_t padding = 0;
        for (size_t i = 0; i < regions.size(); ++i) {
          EXPECT_EQ(regions[i].first % 256, 0) << "region " << i;
          const int64_t end = regions[i].first + regions[i].second;
          const int64_t next = i + 1 < regions.size() ? regions[i + 1].first : total;
          EXPECT_LE(end, next) << "region " << i;
          EXPECT_LT(next - end, 256) << "region " << i;
          padding += next - end;
        }
        EXPECT_EQ(regions.front().first, 0);
        EXPECT_EQ(total % 4, 0);  // whole floats
        EXPECT_LT(padding, int64_t(regions.size()) * 256);
      }
      EXPECT_EQ(2 * hd % 16, 0);  // each row of a copy is whole 16-byte chunks
    }
  }
}

}  // namespace
}  // namespace gnmr
