// The per-epoch window order of data.sampling = shuffled: a bijection of [0, n) for every n
// (including the sizes next to the Feistel network's powers of 4, where cycle walking does the
// most), a different order per epoch and per seed, and the same order on every call.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "data/window_permutation.h"

TEST(WindowPermutation, EveryIndexOnceForEverySizeAndEpoch) {
  for (int64_t n : {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 1000, 4096, 4097}) {
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int> seen(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t w = gnmr::permuted_window(11, epoch, i, n);
        ASSERT_GE(w, 0) << "n " << n;
        ASSERT_LT(w, n) << "n " << n;
        ++seen[static_cast<size_t>(w)];
      }
      for (int64_t w = 0; w < n; ++w) {
        EXPECT_EQ(seen[static_cast<size_t>(w)], 1)
            << "n " << n << " epoch " << epoch << " window " << w;
      }
    }
  }
}

TEST(WindowPermutation, TheOrderDependsOnEpochAndSeedAndIsRepeatable) {
  constexpr int64_t n = 1000;
  auto order = [](uint64_t seed, uint64_t epoch) {
    std::vector<int64_t> o;
    for (int64_t i = 0; i < n; ++i) o.push_back(gnmr::permuted_window(seed, epoch, i, n));
    return o;
  };
  const std::vector<int64_t> base = order(11, 0);
  EXPECT_EQ(order(11, 0), base);
  EXPECT_NE(order(11, 1), base);
  EXPECT_NE(order(12, 0), base);
  int fixed_points = 0;  // a random permutation has about 1
  for (int64_t i = 0; i < n; ++i) fixed_points += base[static_cast<size_t>(i)] == i;
  EXPECT_LT(fixed_points, 10);
  // Neighbouring indices land far apart: the first 100 of the order spread over [0, n).
  int64_t low = 0;
  for (int64_t i = 0; i < 100; ++i) low += base[static_cast<size_t>(i)] < n / 2;
  EXPECT_GT(low, 25);
  EXPECT_LT(low, 75);
}

TEST(WindowPermutation, HalfBitsCoverTheSizeWithTheSmallestPowerOfFour) {
  EXPECT_EQ(gnmr::feistel_half_bits(1), 1);
  EXPECT_EQ(gnmr::feistel_half_bits(4), 1);
  EXPECT_EQ(gnmr::feistel_half_bits(5), 2);
  EXPECT_EQ(gnmr::feistel_half_bits(16), 2);
  EXPECT_EQ(gnmr::feistel_half_bits(17), 3);
  EXPECT_EQ(gnmr::feistel_half_bits(int64_t{1} << 40), 20);
  EXPECT_EQ(gnmr::feistel_half_bits((int64_t{1} << 40) + 1), 21);
}
