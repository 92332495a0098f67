// plan_gradient_buckets: the order, sizes and coverage of the overlapped gradient sum's
// buckets (parallel/gradient_buckets.h), on hand-made layouts and on the real parameter table.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "config/config.h"
#include "model/param_table.h"
#include "parallel/gradient_buckets.h"

namespace gnmr {
namespace {

constexpr double kMiB = 1 << 20;

// 1 MiB of fp32 = 262144 elements.
constexpr int64_t kMiBElements = int64_t(kMiB) / 4;

// Every element of [0, flat_size) in exactly one bucket, buckets in descending order with
// no gap, each bucket's element range exactly its parameters' ranges.
void expect_covers_once(const std::vector<GradientBucket>& buckets,
                        const std::vector<int64_t>& offsets, int64_t flat_size) {
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front().end, flat_size);
  EXPECT_EQ(buckets.front().last_param, int(offsets.size()) - 1);
  EXPECT_EQ(buckets.back().begin, 0);
  EXPECT_EQ(buckets.back().first_param, 0);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const GradientBucket& k = buckets[b];
    EXPECT_LE(k.first_param, k.last_param);
    EXPECT_EQ(k.begin, offsets[size_t(k.first_param)]);
    const int64_t end =
        k.last_param + 1 < int(offsets.size()) ? offsets[size_t(k.last_param) + 1] : flat_size;
    EXPECT_EQ(k.end, end);
    if (b + 1 < buckets.size()) {
      EXPECT_EQ(buckets[b + 1].end, k.begin)
          << "bucket " << b + 1 << " must end where " << b << " begins";
      EXPECT_EQ(buckets[b + 1].last_param + 1, k.first_param);
    }
  }
  std::vector<int> hits(size_t(flat_size), 0);
  for (const GradientBucket& k : buckets) {
    for (int64_t i = k.begin; i < k.end; ++i) hits[size_t(i)] += 1;
  }
  for (int64_t i = 0; i < flat_size; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "element " << i;
}

TEST(GradientBuckets, WholeParametersLastFirstWithinTheCap) {
  // Parameters of 100, 50, 50, 30, 70 elements; a cap of 120 elements.
  const std::vector<int64_t> offsets = {0, 100, 150, 200, 230};
  const int64_t flat = 300;
  const double mb = 120.0 * 4 / kMiB;
  const auto buckets = plan_gradient_buckets(offsets, flat, mb);
  // From the end: {4 (70), 3 (30)} = 100, + 50 would be 150 > 120: close. {2, 1} = 100,
  // + 100 > 120: close. {0} = 100.
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].first_param, 3);
  EXPECT_EQ(buckets[0].last_param, 4);
  EXPECT_EQ(buckets[1].first_param, 1);
  EXPECT_EQ(buckets[1].last_param, 2);
  EXPECT_EQ(buckets[2].first_param, 0);
  EXPECT_EQ(buckets[2].last_param, 0);
  for (const auto& b : buckets) EXPECT_LE(b.numel(), 120);
  expect_covers_once(buckets, offsets, flat);
}

TEST(GradientBuckets, AParameterLargerThanTheCapIsABucketOfItsOwnNeverSplit) {
  const std::vector<int64_t> offsets = {0, 10, 1010, 1020};  // 10, 1000, 10, 5
  const int64_t flat = 1025;
  const auto buckets = plan_gradient_buckets(offsets, flat, 100.0 * 4 / kMiB);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].first_param, 2);  // 10 + 5
  EXPECT_EQ(buckets[1].first_param, 1);  // the 1000 alone
  EXPECT_EQ(buckets[1].last_param, 1);
  EXPECT_EQ(buckets[1].numel(), 1000);
  EXPECT_EQ(buckets[2].first_param, 0);
  expect_covers_once(buckets, offsets, flat);
}

TEST(GradientBuckets, ACapAboveTheWholeGradientIsOneBucket) {
  const std::vector<int64_t> offsets = {0, 64, 128};
  const auto buckets = plan_gradient_buckets(offsets, 192, 25.0);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].first_param, 0);
  EXPECT_EQ(buckets[0].last_param, 2);
  expect_covers_once(buckets, offsets, 192);
}

TEST(GradientBuckets, ATinyCapGivesOneBucketPerParameter) {
  const std::vector<int64_t> offsets = {0, 3, 7, 8};
  const auto buckets = plan_gradient_buckets(offsets, 12, 1e-9);
  ASSERT_EQ(buckets.size(), 4u);
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(buckets[size_t(b)].first_param, 3 - b);
    EXPECT_EQ(buckets[size_t(b)].last_param, 3 - b);
  }
  expect_covers_once(buckets, offsets, 12);
}

TEST(GradientBuckets, LlamaTableSplitsIntoLayersLastLayerFirst) {
  // q, k, v, o are 0.25 MiB each, gate, up, down 0.67 MiB, a layer 3.02 MiB, the embedding
  // and lm_head 0.98 MiB: caps below a projection, below a layer and above one.
  ModelConfig model;
  model.dim = 256;
  model.n_layers = 4;
  model.n_heads = 4;
  model.n_kv_heads = 4;
  model.ffn_dim = 688;
  model.vocab_size = 1000;
  const ParamTable table = build_param_table(model);
  const std::vector<int64_t> offsets = param_offsets(table.params);
  for (double mb : {0.25, 1.0, 3.0}) {
    SCOPED_TRACE(mb);
    const auto buckets = plan_gradient_buckets(offsets, table.flat_size, mb);
    expect_covers_once(buckets, offsets, table.flat_size);
    for (const GradientBucket& b : buckets) {
      if (b.first_param != b.last_param) {
        EXPECT_LE(double(b.numel()), mb * kMiBElements);
      }
    }
    // lm_head comes first: it is backward's first gradient.
    EXPECT_EQ(buckets.front().last_param, table.lm_head);
    const std::vector<int> bucket_of = bucket_of_each_param(buckets, int(table.params.size()));
    // Later layers never sit in a later bucket than earlier ones.
    for (size_t p = 1; p < bucket_of.size(); ++p) EXPECT_LE(bucket_of[p], bucket_of[p - 1]);
  }
  // 0.25 MiB: each gate, up and down (0.67 MiB) alone; q (exactly 0.25 MiB) alone too.
  const auto small = plan_gradient_buckets(offsets, table.flat_size, 0.25);
  const std::vector<int> small_of = bucket_of_each_param(small, int(table.params.size()));
  const LayerParamIndex& last = table.layers.back();
  for (int kind : {int(ProjectionKind::Gate), int(ProjectionKind::Up), int(ProjectionKind::Down),
                   int(ProjectionKind::Q)}) {
    const GradientBucket& b = small[size_t(small_of[size_t(last.proj[kind])])];
    EXPECT_EQ(b.first_param, b.last_param) << "kind " << kind;
  }
  // 16 MiB holds the whole 14 MiB gradient.
  EXPECT_EQ(plan_gradient_buckets(offsets, table.flat_size, 16.0).size(), 1u);
}

TEST(GradientBuckets, RefusesBadSizesAndOffsets) {
  EXPECT_THROW(plan_gradient_buckets({0, 10}, 20, 0.0), std::invalid_argument);
  EXPECT_THROW(plan_gradient_buckets({0, 10}, 20, -1.0), std::invalid_argument);
  EXPECT_THROW(plan_gradient_buckets({0, 10}, 20, std::nan("")), std::invalid_argument);
  EXPECT_THROW(plan_gradient_buckets({5, 10}, 20, 1.0), std::invalid_argument);
  EXPECT_THROW(plan_gradient_buckets({0, 10, 10}, 20, 1.0), std::invalid_argument);
  EXPECT_THROW(plan_gradient_buckets({0, 10}, 10, 1.0), std::invalid_argument);
  EXPECT_TRUE(plan_gradient_buckets({}, 0, 1.0).empty());
}

TEST(GradientBuckets, BucketOfEachParamRefusesAPlanThatMissesOrRepeatsAParameter) {
  std::vector<GradientBucket> gap = {{2, 2, 20, 30}, {0, 0, 0, 10}};
  EXPECT_THROW(bucket_of_each_param(gap, 3), std::invalid_argument);
  std::vector<GradientBucket> twice = {{1, 2, 10, 30}, {0, 1, 0, 20}};
  EXPECT_THROW(bucket_of_each_param(twice, 3), std::invalid_argument);
  std::vector<GradientBucket> fine = {{1, 2, 10, 30}, {0, 0, 0, 10}};
  EXPECT_EQ(bucket_of_each_param(fine, 3), (std::vector<int>{1, 0, 0}));
}

}  // namespace
}  // namespace gnmr
