// The batched launches' index rule (backend/launch_batch.h), which the sum of squares and the
// 128x128 weight quantizer run on the GPU: every item of every member, against a linear scan.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/launch_batch.h"

namespace gnmr {
namespace {

// first[] of members with these item counts, laid end to end from `start`.
std::vector<int64_t> offsets(int64_t start, const std::vector<int64_t>& counts) {
  std::vector<int64_t> first{start};
  for (int64_t c : counts) first.push_back(first.back() + c);
  return first;
}

TEST(LaunchBatch, EveryItemFindsTheMemberHoldingItAndEmptyMembersNone) {
  const std::vector<std::vector<int64_t>> batches = {
      {1},
      {5},
      {3, 1, 4},
      {0, 2, 0, 0, 3, 0},  // members without items, first and last included
      {256, 704, 704, 256, 256, 256, 704},
      std::vector<int64_t>(48, 7),
  };
  for (int64_t start : {int64_t{0}, int64_t{1000}}) {  // the sum of squares' later batches
    for (const std::vector<int64_t>& counts : batches) {
      const std::vector<int64_t> first = offsets(start, counts);
      const int num = static_cast<int>(counts.size());
      for (int64_t index = first.front(); index < first.back(); ++index) {
        int expected = 0;
        while (first[static_cast<size_t>(expected) + 1] <= index) ++expected;
        const int t = batch_member(first.data(), num, index);
        ASSERT_EQ(t, expected) << "item " << index << " of " << num << " members";
        ASSERT_GT(counts[static_cast<size_t>(t)], 0);
      }
    }
  }
}

}  // namespace
}  // namespace gnmr
