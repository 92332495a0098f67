// The ZeRO-1 collectives' index rules (parallel/shard_ranges.h), which the NCCL communicator's
// bucketed reduce-scatter turns into one ncclReduce per piece: every range cut into pieces that
// each lie in one owner's shard, and, on the real parameter table's bucket plan, a host
// emulation of those reduces (root's piece = the sum of every rank's copy) leaving each rank's
// shard holding the whole reduce-scatter, every element summed exactly once.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "config/config.h"
#include "model/param_table.h"
#include "parallel/gradient_buckets.h"
#include "parallel/shard_ranges.h"
#include "util/error.h"

namespace gnmr {
namespace {

TEST(ShardRanges, EveryRangeIsCutAtTheShardEdgesInOwnerOrder) {
  for (int world = 1; world <= 4; ++world) {
    for (int64_t shard = 0; shard <= 5; ++shard) {
      const int64_t total = world * shard;
      for (int64_t begin = 0; begin <= total; ++begin) {
        for (int64_t end = begin; end <= total; ++end) {
          SCOPED_TRACE(testing::Message() << "world " << world << " shard " << shard << " ["
                                          << begin << ", " << end << ")");
          const std::vector<ShardRange> pieces = shard_ranges_of(shard, world, begin, end);
          int64_t next = begin;
          int previous_owner = -1;
          for (const ShardRange& p : pieces) {
            EXPECT_EQ(p.begin, next) << "the pieces leave a gap or overlap";
            EXPECT_GT(p.count(), 0) << "an empty piece";
            EXPECT_GT(p.owner, previous_owner) << "owners out of order";
            EXPECT_GE(p.begin, p.owner * shard) << "a piece starts before its owner's shard";
            EXPECT_LE(p.end, (p.owner + 1) * shard) << "a piece runs past its owner's shard";
            next = p.end;
            previous_owner = p.owner;
          }
          EXPECT_EQ(next, end) << "the pieces do not reach the end of the range";
        }
      }
    }
  }
}

TEST(ShardRanges, RefusesWhatIsNotARangeOfTheShards) {
  EXPECT_THROW(shard_ranges_of(4, 0, 0, 0), std::invalid_argument);
  EXPECT_THROW(shard_ranges_of(-1, 2, 0, 0), std::invalid_argument);
  EXPECT_THROW(shard_ranges_of(4, 2, 3, 2), std::invalid_argument);
  EXPECT_THROW(shard_ranges_of(4, 2, -1, 2), std::invalid_argument);
  EXPECT_THROW(shard_ranges_of(4, 2, 0, 9), std::invalid_argument);
}

TEST(ShardRanges, ShardElementsNamesTheTensorThatDoesNotSplit) {
  std::vector<float> host(12);
  Tensor t;
  t.data = host.data();
  t.shape = {12};
  EXPECT_EQ(shard_elements(t, 3, "all_gather"), 4u);
  try {
    shard_elements(t, 5, "all_gather");
    FAIL() << "12 elements do not split into 5 shards";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather: [12] does not split into 5 equal shards"),
              std::string::npos)
        << e.what();
  }
  Tensor f64 = t;
  f64.dtype = DType::F64;
  f64.shape = {6};
  EXPECT_THROW(shard_elements(f64, 2, "reduce_scatter_sum"), Error);
  EXPECT_THROW(check_element_range(t, 5, 13, "start_reduce_scatter_sum"), Error);
  EXPECT_NO_THROW(check_element_range(t, 12, 12, "start_reduce_scatter_sum"));
}

// ZeRO-1 with buckets, as nccl_communicator.cpp issues it: for every bucket of the plan over the
// padded flat gradient, every piece is reduced to its owner in place. Integer-valued floats make
// every sum exact, so a piece reduced twice (the owner's copy would be added again) or missed
// shows as a wrong value.
TEST(ShardRanges, PerPieceReducesOfEveryBucketGiveEachRankItsShardOfTheSum) {
  ModelConfig model;
  model.dim = 64;
  model.n_layers = 2;
  model.n_heads = 4;
  model.n_kv_heads = 2;
  model.ffn_dim = 176;
  model.vocab_size = 300;
  const ParamTable table = build_param_table(model);
  const std::vector<int64_t> offsets = param_offsets(table.params);
  for (int world : {2, 3, 5}) {
    for (double bucket_mb : {0.01, 0.05, 1.0}) {
      SCOPED_TRACE(testing::Message() << world << " ranks, buckets of " << bucket_mb << " MiB");
      const int64_t align = int64_t(world) * 64;  // as the session pads for ZeRO-1
      const int64_t padded = (table.flat_size + align - 1) / align * align;
      const int64_t shard = padded / world;
      const std::vector<GradientBucket> buckets = plan_gradient_buckets(offsets, padded, bucket_mb);
      std::vector<std::vector<float>> ranks(size_t(world),
                                            std::vector<float>(size_t(padded), 0.0f));
      for (int r = 0; r < world; ++r) {
        for (int64_t i = 0; i < padded; ++i) ranks[size_t(r)][size_t(i)] = float((i * 7 + r) % 97);
      }
      const std::vector<std::vector<float>> before = ranks;
      for (const GradientBucket& b : buckets) {
        for (const ShardRange& piece : shard_ranges_of(shard, world, b.begin, b.end)) {
          for (int64_t i = piece.begin; i < piece.end; ++i) {
            float sum = 0;
            for (int r = 0; r < world; ++r) sum += ranks[size_t(r)][size_t(i)];
            ranks[size_t(piece.owner)][size_t(i)] = sum;
          }
        }
      }
      for (int r = 0; r < world; ++r) {
        for (int64_t i = r * shard; i < (r + 1) * shard; ++i) {
          float expected = 0;
          for (int s = 0; s < world; ++s) expected += before[size_t(s)][size_t(i)];
          ASSERT_EQ(ranks[size_t(r)][size_t(i)], expected) << "rank " << r << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gnmr
