// The ZeRO-1 shard layout: every element of every parameter is owned by exactly one rank,
// shards are equal and aligned, and the padding stays under one alignment block per rank.
#include <gtest/gtest.h>

#include "config/config.h"
#include "model/param_table.h"
#include "test_paths.h"
#include "train/zero_shards.h"

namespace gnmr {
namespace {

ParamInfo param(const std::string& name, std::vector<int64_t> shape, int64_t offset) {
  ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.offset = offset;
  return p;
}

TEST(ZeroShardLayout, SplitsAParameterThatCrossesAShardBoundary) {
  // a: 200 elements at 0, b: 10 at 256; flat 320. Two ranks: 160 each, aligned up to 192.
  std::vector<ParamInfo> params = {param("a", {20, 10}, 0), param("b", {10}, 256)};
  ZeroShardLayout layout = make_zero_shard_layout(params, 320, 2);
  EXPECT_EQ(layout.shard_elements, 192);
  EXPECT_EQ(layout.padded_elements(), 384);
  EXPECT_EQ(layout.padding_elements(), 64);
  ASSERT_EQ(layout.pieces[0].size(), 1u);
  EXPECT_EQ(layout.pieces[0][0].param_index, 0);
  EXPECT_EQ(layout.pieces[0][0].param_begin, 0);
  EXPECT_EQ(layout.pieces[0][0].count, 192);
  EXPECT_EQ(layout.pieces[0][0].shard_offset, 0);
  ASSERT_EQ(layout.pieces[1].size(), 2u);
  EXPECT_EQ(layout.pieces[1][0].param_index, 0);
  EXPECT_EQ(layout.pieces[1][0].param_begin, 192);
  EXPECT_EQ(layout.pieces[1][0].count, 8);
  EXPECT_EQ(layout.pieces[1][0].shard_offset, 0);
  EXPECT_EQ(layout.pieces[1][1].param_index, 1);
  EXPECT_EQ(layout.pieces[1][1].param_begin, 0);
  EXPECT_EQ(layout.pieces[1][1].count, 10);
  EXPECT_EQ(layout.pieces[1][1].shard_offset, 64);
}

TEST(ZeroShardLayout, OneRankOwnsEverythingWithoutPadding) {
  std::vector<ParamInfo> params = {param("a", {20, 10}, 0), param("b", {10}, 256)};
  ZeroShardLayout layout = make_zero_shard_layout(params, 320, 1);
  EXPECT_EQ(layout.shard_elements, 320);
  EXPECT_EQ(layout.padding_elements(), 0);
  ASSERT_EQ(layout.pieces[0].size(), 2u);
  EXPECT_EQ(layout.pieces[0][0].count, 200);
  EXPECT_EQ(layout.pieces[0][1].shard_offset, 256);
}

TEST(ZeroShardLayout, EveryElementOfTheTinyModelHasExactlyOneOwner) {
  RunConfig config = load_run_config(gnmr_test::source_path("configs/models/tiny.json"), {});
  const ParamTable table = build_param_table(config.model);
  for (int world : {1, 2, 3, 5, 8}) {
    ASSERT_EQ(flat_elements_of(table.params), table.flat_size);
    ZeroShardLayout layout = make_zero_shard_layout(table.params, table.flat_size, world);
    EXPECT_EQ(layout.shard_elements % kZeroShardAlign, 0);
    EXPECT_GE(layout.padding_elements(), 0);
    EXPECT_LT(layout.padding_elements(), world * kZeroShardAlign);
    std::vector<int> owners(size_t(layout.padded_elements()), 0);
    for (int rank = 0; rank < world; ++rank) {
      int64_t previous_end = 0;
      for (const ShardPiece& piece : layout.pieces[size_t(rank)]) {
        EXPECT_GE(piece.shard_offset, previous_end);  // in flat order, not overlapping
        EXPECT_LE(piece.shard_offset + piece.count, layout.shard_elements);
        previous_end = piece.shard_offset + piece.count;
        const ParamInfo& p = table.params[size_t(piece.param_index)];
        // The piece's place in the shard is its place in the flat buffer.
        EXPECT_EQ(layout.shard_begin(rank) + piece.shard_offset, p.offset + piece.param_begin);
        for (int64_t e = 0; e < piece.count; ++e)
          owners[size_t(p.offset + piece.param_begin + e)]++;
      }
    }
    for (const ParamInfo& p : table.params) {
      for (int64_t e = 0; e < param_numel(p); ++e) {
        ASSERT_EQ(owners[size_t(p.offset + e)], 1)
            << p.name << " element " << e << ", " << world << " ranks";
      }
    }
  }
}

}  // namespace
}  // namespace gnmr
