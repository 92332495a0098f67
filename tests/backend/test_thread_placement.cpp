// thread_oversubscription_warning (src/backend/cpu/thread_placement.h) on placements as plain
// data: quiet when the threads fit, and a warning naming the numbers and the fix when one
// process asks for more threads than its mask allows or the node's ranks together ask for more
// than the node has.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/thread_placement.h"

namespace gnmr {
namespace {

ThreadPlacement placement(int threads, int allowed, int node, int ranks) {
  ThreadPlacement p;
  p.threads = threads, p.allowed_cores = allowed, p.node_cores = node, p.local_ranks = ranks;
  return p;
}

void expect_contains(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos) << "\"" << needle << "\" not in: " << text;
}

TEST(ThreadPlacement, QuietWhenTheThreadsFit) {
  EXPECT_EQ(thread_oversubscription_warning(placement(2, 2, 2, 1)), "");
  EXPECT_EQ(thread_oversubscription_warning(placement(1, 2, 2, 1)), "");
  // Two ranks bound to 16 cores each of 32.
  EXPECT_EQ(thread_oversubscription_warning(placement(16, 16, 32, 2)), "");
  // The launcher does not say how many ranks share the node: nothing to compare.
  EXPECT_EQ(thread_oversubscription_warning(placement(32, 32, 32, -1)), "");
}

TEST(ThreadPlacement, WarnsWhenTheRanksOfANodeAskForMoreThreadsThanItHasCores) {
  // mpirun -np 2 without binding: each rank sees all 2 cores and runs 2 threads.
  const std::string w = thread_oversubscription_warning(placement(2, 2, 2, 2));
  expect_contains(w, "2 ranks on this node each run 2 OpenMP thread(s)");
  expect_contains(w, "4 in all on 2 cores");
  expect_contains(w, "train.threads=1");
  expect_contains(w, "--bind-to core");
  expect_contains(w, "OMP_WAIT_POLICY=passive");
  // Four ranks on 64 cores, bound per socket (32 cores each): 4 x 32 > 64.
  expect_contains(thread_oversubscription_warning(placement(32, 32, 64, 4)), "train.threads=16");
}

TEST(ThreadPlacement, WarnsWhenThreadsExceedTheAffinityMask) {
  const std::string w = thread_oversubscription_warning(placement(8, 4, 64, 1));
  expect_contains(w, "train.threads=8 but this process may run on only 4 core(s)");
  expect_contains(w, "train.threads=4 or fewer");
}

TEST(ThreadPlacement, TheCurrentProcessHasCoresToRunOn) {
  const ThreadPlacement p = current_thread_placement(1, 1);
  EXPECT_GE(p.allowed_cores, 1);
  EXPECT_GE(p.node_cores, p.allowed_cores);
  EXPECT_EQ(thread_oversubscription_warning(p), "");
}

}  // namespace
}  // namespace gnmr
