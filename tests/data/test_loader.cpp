// TokenLoader over synthetic shards: windows are consecutive tokens, batches are a pure
// function of (seed, rank, world, step, micro_step, row), eval windows tile the shards, and
// bad shard sets are Data errors naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "data_test_helpers.h"
#include "test_paths.h"

using gnmr::TokenLoader;

namespace {

constexpr int kVocab = 50000;  // uint16 shards; token value = position, so windows are legible

// Two shards whose tokens are 0, 1, 2, ... (continuing across shards).
std::string make_counting_shards(const std::string& name, int64_t first, int64_t second) {
  const std::string dir = gnmr_test::scratch_dir(name);
  std::vector<int32_t> a(first), b(second);
  for (int64_t i = 0; i < first; ++i) a[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < second; ++i) b[i] = static_cast<int32_t>(first + i);
  gnmr::write_shard_atomic(dir + "/train_000000.bin", a, kVocab);
  gnmr::write_shard_atomic(dir + "/train_000001.bin", b, kVocab);
  return dir;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  bool operator==(const Batch& o) const { return tokens == o.tokens && targets == o.targets; }
};

Batch batch_at(const TokenLoader& loader, int64_t step, int micro_step, int micro_batch) {
  Batch b;
  b.tokens.resize(static_cast<size_t>(micro_batch) * loader.seq_len());
  b.targets.resize(b.tokens.size());
  loader.next_batch_at(step, micro_step, micro_batch, b.tokens.data(), b.targets.data());
  return b;
}

}  // namespace

TEST(TokenLoader, RandomRowsAreConsecutiveWindowsWithShiftedTargets) {
  const std::string dir = make_counting_shards("loader_windows", 3000, 2000);
  TokenLoader loader(dir + "/train_*.bin", 32, kVocab, "random", 5, 0, 1);
  EXPECT_EQ(loader.total_tokens(), 5000);
  for (int64_t step = 0; step < 20; ++step) {
    const Batch b = batch_at(loader, step, 0, 8);
    for (int r = 0; r < 8; ++r) {
      const int32_t start = b.tokens[r * 32];
      for (int t = 0; t < 32; ++t) {
        ASSERT_EQ(b.tokens[r * 32 + t], start + t);
        ASSERT_EQ(b.targets[r * 32 + t], start + t + 1);
      }
      // Windows stay inside one shard: never straddle token 2999 -> 3000.
      EXPECT_TRUE(start + 32 < 3000 || start >= 3000) << "window at " << start;
    }
  }
}

TEST(TokenLoader, SameCoordinatesGiveTheSameBatchAcrossSeparateLoaders) {
  const std::string dir = make_counting_shards("loader_determinism", 4000, 4000);
  const std::string glob = dir + "/train_*.bin";
  TokenLoader first(glob, 16, kVocab, "random", 42, 1, 4, 2);
  TokenLoader restarted(glob, 16, kVocab, "random", 42, 1, 4, 2);  // a resumed run
  EXPECT_TRUE(batch_at(first, 123, 1, 4) == batch_at(restarted, 123, 1, 4));
  // Asking out of order changes nothing: no hidden state.
  batch_at(restarted, 7, 0, 4);
  EXPECT_TRUE(batch_at(first, 124, 0, 4) == batch_at(restarted, 124, 0, 4));

  TokenLoader other_rank(glob, 16, kVocab, "random", 42, 2, 4, 2);
  TokenLoader other_seed(glob, 16, kVocab, "random", 43, 1, 4, 2);
  EXPECT_FALSE(batch_at(first, 123, 1, 4) == batch_at(other_rank, 123, 1, 4));
  EXPECT_FALSE(batch_at(first, 123, 1, 4) == batch_at(other_seed, 123, 1, 4));
  EXPECT_FALSE(batch_at(first, 123, 1, 4) == batch_at(first, 123, 0, 4));
  EXPECT_FALSE(batch_at(first, 123, 1, 4) == batch_at(first, 124, 1, 4));
}

TEST(TokenLoader, SequentialRanksTakeStridedWindowsWithoutOverlap) {
  const std::string dir = make_counting_shards("loader_sequential", 1001, 801);
  const std::string glob = dir + "/train_*.bin";
  constexpr int seq_len = 100, world = 2, micro_steps = 2, micro_batch = 3;
  // (1001 - 1) / 100 + (801 - 1) / 100 = 18 windows; one step is 2 micro x 3 rows x 2 ranks
  // = 12 rows, all of which must be different windows.
  std::vector<int32_t> starts;
  for (int64_t step = 0; step < 1; ++step) {
    for (int micro = 0; micro < micro_steps; ++micro) {
      for (int rank = 0; rank < world; ++rank) {
        TokenLoader loader(glob, seq_len, kVocab, "sequential", 0, rank, world, micro_steps);
        const Batch b = batch_at(loader, step, micro, micro_batch);
        for (int r = 0; r < micro_batch; ++r) starts.push_back(b.tokens[r * seq_len]);
      }
    }
  }
  // Each window starts on the stride grid of its own shard.
  std::set<int32_t> distinct(starts.begin(), starts.end());
  EXPECT_EQ(distinct.size(), starts.size());
  for (int32_t s : distinct) EXPECT_EQ((s < 1001 ? s : s - 1001) % seq_len, 0) << s;
  TokenLoader rank0(glob, seq_len, kVocab, "sequential", 0, 0, world, micro_steps);
  TokenLoader rank1(glob, seq_len, kVocab, "sequential", 0, 1, world, micro_steps);
  EXPECT_EQ(batch_at(rank0, 0, 0, 1).tokens[0], 0);
  EXPECT_EQ(batch_at(rank1, 0, 0, 1).tokens[0], 100);
}

// The window starts the whole world reads at STEP: every rank's rows of every micro-step.
std::vector<int32_t> step_starts(const std::string& glob, const std::string& sampling, int world,
                                 int micro_steps, int micro_batch, int64_t step) {
  constexpr int seq_len = 100;
  std::vector<int32_t> starts;
  for (int rank = 0; rank < world; ++rank) {
    TokenLoader loader(glob, seq_len, kVocab, sampling, 7, rank, world, micro_steps);
    for (int micro = 0; micro < micro_steps; ++micro) {
      const Batch b = batch_at(loader, step, micro, micro_batch);
      for (int r = 0; r < micro_batch; ++r) starts.push_back(b.tokens[r * seq_len]);
    }
  }
  return starts;
}

// 18 windows; a step of 3 micro-steps x 3 rows x 2 ranks reads 18 rows: one epoch per step.
// Each epoch reads every window once, in an order of its own.
TEST(TokenLoader, ShuffledReadsEveryWindowOncePerEpochInANewOrder) {
  const std::string glob = make_counting_shards("loader_shuffled", 1001, 801) + "/train_*.bin";
  const std::vector<int32_t> sequential = step_starts(glob, "sequential", 2, 3, 3, 0);
  const std::set<int32_t> all(sequential.begin(), sequential.end());
  ASSERT_EQ(all.size(), 18u);
  std::vector<std::vector<int32_t>> epochs;
  for (int64_t step = 0; step < 3; ++step) {
    epochs.push_back(step_starts(glob, "shuffled", 2, 3, 3, step));
    EXPECT_EQ(std::set<int32_t>(epochs.back().begin(), epochs.back().end()), all)
        << "epoch " << step << " is not every window once";
    EXPECT_EQ(epochs.back().size(), 18u);
    EXPECT_NE(epochs.back(), sequential);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

// A step's global rows are the same whatever the split into ranks and micro-steps, so a run
// resumed on another number of ranks reads, at each step, the windows the first would have.
TEST(TokenLoader, ShuffledStepsReadTheSameWindowsForAnyWorldSize) {
  const std::string glob =
      make_counting_shards("loader_shuffled_world", 1001, 801) + "/train_*.bin";
  for (int64_t step = 0; step < 6; ++step) {  // 6 rows a step: an epoch every 3 steps
    std::vector<int32_t> one = step_starts(glob, "shuffled", 1, 3, 2, step);
    std::vector<int32_t> three = step_starts(glob, "shuffled", 3, 1, 2, step);
    std::vector<int32_t> six = step_starts(glob, "shuffled", 6, 1, 1, step);
    std::sort(one.begin(), one.end());
    std::sort(three.begin(), three.end());
    std::sort(six.begin(), six.end());
    EXPECT_EQ(one, three) << "step " << step;
    EXPECT_EQ(one, six) << "step " << step;
    EXPECT_EQ(std::set<int32_t>(one.begin(), one.end()).size(), 6u) << "step " << step;
  }
}

TEST(TokenLoader, EvalWindowsTileEachShardInOrder) {
  const std::string dir = make_counting_shards("loader_eval", 1001, 555);
  TokenLoader loader(dir + "/train_*.bin", 50, kVocab, "sequential", 0, 0, 1);
  ASSERT_EQ(loader.num_eval_windows(), 1000 / 50 + 554 / 50);
  std::vector<int32_t> tokens(50), targets(50);
  int64_t covered_targets = 0;
  int32_t expected_start = 0;
  for (int64_t i = 0; i < loader.num_eval_windows(); ++i) {
    loader.eval_window(i, tokens.data(), targets.data());
    if (i == 1000 / 50) expected_start = 1001;  // second shard starts fresh
    EXPECT_EQ(tokens[0], expected_start);
    EXPECT_EQ(targets[49], expected_start + 50);
    expected_start += 50;
    covered_targets += 50;
  }
  EXPECT_EQ(covered_targets, 1000 + 550);
}

// Shards of a larger vocabulary hold ids the model cannot embed; a smaller one is a model
// vocabulary padded above the tokenizer's, and loads.
TEST(TokenLoader, ShardsOfALargerVocabularyAreADataErrorNamingBothSizes) {
  const std::string dir = make_counting_shards("loader_vocab", 100, 100);
  gnmr_test::expect_data_error(
      [&] { TokenLoader loader(dir + "/train_*.bin", 8, 32000, "random", 0, 0, 1); },
      {dir + "/train_000000.bin", "50000", "32000", "more than"});
  TokenLoader padded(dir + "/train_*.bin", 8, 50048, "random", 0, 0, 1);
  EXPECT_GT(padded.total_tokens(), 0);
}

TEST(TokenLoader, GlobMatchingNothingIsADataErrorNamingIt) {
  const std::string glob = gnmr_test::scratch_dir("loader_empty") + "/train_*.bin";
  gnmr_test::expect_data_error([&] { TokenLoader loader(glob, 8, kVocab, "random", 0, 0, 1); },
                               {glob, "no file matches"});
}

TEST(TokenLoader, CorruptShardInTheGlobIsADataErrorNamingIt) {
  const std::string dir = make_counting_shards("loader_corrupt", 100, 100);
  std::string bytes = gnmr_test::read_bytes(dir + "/train_000001.bin");
  bytes.resize(bytes.size() - 10);
  gnmr_test::write_text(dir + "/train_000001.bin", bytes);
  gnmr_test::expect_data_error(
      [&] { TokenLoader loader(dir + "/train_*.bin", 8, kVocab, "random", 0, 0, 1); },
      {dir + "/train_000001.bin", "truncated"});
}

TEST(TokenLoader, ShardsShorterThanOneWindowAreADataError) {
  const std::string dir = make_counting_shards("loader_short", 10, 10);
  gnmr_test::expect_data_error(
      [&] { TokenLoader loader(dir + "/train_*.bin", 64, kVocab, "random", 0, 0, 1); },
      {"seq_len"});
}

TEST(TokenLoader, UnknownSamplingIsAConfigError) {
  const std::string dir = make_counting_shards("loader_sampling", 100, 100);
  gnmr_test::expect_error(
      [&] { TokenLoader loader(dir + "/train_*.bin", 8, kVocab, "shuffle", 0, 0, 1); },
      gnmr::ErrorKind::Config, {"shuffle"});
}
