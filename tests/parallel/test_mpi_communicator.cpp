// MpiCommunicator across the ranks of `mpirun -np 2` and `-np 3` (any world of two or more
// works).
// Every test is a collective sequence: each rank runs the same calls in the same order, and
// checks use EXPECT (not ASSERT) between collectives so a failure cannot desynchronize ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backend_tensors.h"
#include "parallel/launch_env.h"
#include "parallel/mpi_communicator.h"
#ifdef GNMR_WITH_NCCL
#include "parallel/nccl_communicator.h"
#endif
#include "tests/parallel/world.h"
#include "util/error.h"

namespace gnmr {
namespace {

using testing::host_tensor;

// A value that differs per rank and per element and has no short binary expansion, so the
// float sum rounds (a sum that only adds small integers would hide a wrong order).
float rank_value(int rank, size_t i) {
  return std::sin(0.37f * float(i) + 1.3f * float(rank)) * float(1 + rank) * 1e3f / float(1 + i);
}

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gnmr_test::world().world_size() < 2) {
      GTEST_SKIP() << "needs two ranks: run under mpirun -np 2 (ctest parallel.mpi_two_ranks)";
    }
  }
  Communicator& world() { return gnmr_test::world(); }
  int rank() { return world().rank(); }
  int world_size() { return world().world_size(); }

  // True on every rank when `bytes` are identical on every rank: rank 0's copy is
  // broadcast and compared, then the verdicts are combined.
  bool identical_on_every_rank(const void* bytes, size_t size) {
    std::vector<char> root_copy(static_cast<const char*>(bytes),
                                static_cast<const char*>(bytes) + size);
    world().broadcast(root_copy.data(), size, 0);
    const bool same_here = std::memcmp(root_copy.data(), bytes, size) == 0;
    return world().all_agree(same_here ? 1 : 0) && same_here;
  }
};

TEST_F(MpiCommunicatorTest, RanksAreDistinctAndLocalRanksInRange) {
  EXPECT_EQ(world().name(), "mpi");
  std::vector<double> one_hot(static_cast<size_t>(world_size()), 0.0);
  one_hot[static_cast<size_t>(rank())] = 1.0;
  world().allreduce_sum(one_hot.data(), one_hot.size());
  for (double v : one_hot) EXPECT_EQ(v, 1.0);
  EXPECT_GE(world().local_rank(), 0);
  EXPECT_LT(world().local_rank(), world_size());
}

TEST_F(MpiCommunicatorTest, LaunchEnvironmentMatchesWhatMpiSees) {
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.source, "mpi");
  EXPECT_EQ(env.rank, rank());
  EXPECT_EQ(env.world_size, world_size());
  EXPECT_EQ(env.local_rank, world().local_rank());  // all ranks of the test share a node
}

TEST_F(MpiCommunicatorTest, TensorAllreduceEqualsTheSumComputedLocally) {
  const size_t n = 1000;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = rank_value(rank(), i);
  Tensor t = host_tensor(values);
  world().allreduce_sum(t);
  for (size_t i = 0; i < n; ++i) {
    float expected = 0.0f;
    double magnitude = 0.0;
    for (int r = 0; r < world_size(); ++r) {
      expected += rank_value(r, i);
      magnitude += std::fabs(rank_value(r, i));
    }
    if (world_size() == 2) {
      // Two addends: a + b == b + a exactly in IEEE arithmetic, whatever order MPI used.
      EXPECT_EQ(values[i], expected) << "element " << i;
    } else {
      // More addends may be summed in another order: each addition rounds by <= 2^-24.
      EXPECT_NEAR(values[i], expected, magnitude * world_size() * 0x1p-24) << "element " << i;
    }
  }
}

TEST_F(MpiCommunicatorTest, TensorAllreduceIsBitIdenticalOnEveryRank) {
  const size_t n = 4099;  // not a multiple of anything MPI might segment by
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = rank_value(rank(), i) * 1e-3f + 1e4f;
  Tensor t = host_tensor(values);
  world().allreduce_sum(t);
  EXPECT_TRUE(identical_on_every_rank(values.data(), n * sizeof(float)));
}

TEST_F(MpiCommunicatorTest, ChunkedAllreduceSumsEveryElementOnce) {
  MpiCommunicator chunked(/*max_elements_per_call=*/3);
  const size_t n = 10;  // 3 + 3 + 3 + 1
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = float((rank() + 1) * 100 + int(i));
  Tensor t = host_tensor(values);
  chunked.allreduce_sum(t);
  const int rank_sum = world_size() * (world_size() + 1) / 2;  // sum of (r + 1)
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(values[i], float(rank_sum * 100 + world_size() * int(i))) << "element " << i;
  }
  std::vector<double> doubles = {double(rank()), 0.5, -1.0, 2.0};
  chunked.allreduce_sum(doubles.data(), doubles.size());
  EXPECT_EQ(doubles, (std::vector<double>{double(rank_sum - world_size()), 0.5 * world_size(),
                                          -1.0 * world_size(), 2.0 * world_size()}));
}

TEST_F(MpiCommunicatorTest, DoubleAllreduceSumsLossTotals) {
  double totals[3] = {0.25 * (rank() + 1), 1e12 + rank(), -3.0};
  world().allreduce_sum(totals, 3);
  const int w = world_size();
  EXPECT_EQ(totals[0], 0.25 * w * (w + 1) / 2);
  EXPECT_EQ(totals[1], 1e12 * w + w * (w - 1) / 2);
  EXPECT_EQ(totals[2], -3.0 * w);
  EXPECT_TRUE(identical_on_every_rank(totals, sizeof(totals)));
}

TEST_F(MpiCommunicatorTest, F64TensorAllreduceGivesTheBitsOfTheDoubleAllreduce) {
  // The trainer all-reduces its loss sum as an F64 tensor in backend memory; it must be the
  // sum the host-double path gave before (the recorded runs pin it).
  std::vector<double> as_tensor = {0.1 * (rank() + 1), 1e12 + rank() / 3.0, -3.0};
  std::vector<double> as_doubles = as_tensor;
  Tensor t;
  t.data = as_tensor.data();
  t.dtype = DType::F64;
  t.shape = {3};
  world().allreduce_sum(t);
  world().allreduce_sum(as_doubles.data(), as_doubles.size());
  EXPECT_EQ(as_tensor, as_doubles);
}

TEST_F(MpiCommunicatorTest, EmptyAllreducesAreNoOps) {
  Tensor empty;
  empty.shape = {0};
  world().allreduce_sum(empty);
  world().allreduce_sum(static_cast<double*>(nullptr), 0);
  world().barrier();
}

TEST_F(MpiCommunicatorTest, RejectsNonF32TensorsBeforeCommunicating) {
  std::vector<float> storage(4);
  Tensor t = host_tensor(storage);
  t.dtype = DType::I32;
  EXPECT_THROW(world().allreduce_sum(t), Error);
  world().barrier();  // still in step: the check threw before any collective
}

// ZeRO-1's collectives (communicator.h). The expected sum is computed here in the documented
// order, rank 0 first, so equality is exact for any world size (run with 2 and 3 ranks).
TEST_F(MpiCommunicatorTest, ReduceScatterGivesEachRankTheRankOrderSumOfItsShard) {
  const size_t shard = 1001;  // odd, so no power-of-two segmenting hides a wrong offset
  const size_t n = shard * size_t(world_size());
  for (size_t max_per_call : {MpiCommunicator::kDefaultMaxElementsPerCall, size_t{7}}) {
    MpiCommunicator comm(max_per_call);  // 7: chunks of 7 / world elements, last one short
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = rank_value(rank(), i);
    Tensor t = host_tensor(values);
    comm.reduce_scatter_sum(t);
    for (size_t i = 0; i < shard; ++i) {
      const size_t flat = size_t(rank()) * shard + i;
      float expected = rank_value(0, flat);
      for (int r = 1; r < world_size(); ++r) expected += rank_value(r, flat);
      EXPECT_EQ(values[flat], expected) << "element " << i << ", max per call " << max_per_call;
    }
  }
}

TEST_F(MpiCommunicatorTest, ReduceScatterOfTwoRanksEqualsTheAllreduce) {
  // The plain path (reduce + broadcast) and ZeRO-1 then hand the update the same gradient.
  if (world_size() != 2) GTEST_SKIP() << "three addends may be added in another order";
  const size_t n = 2 * 513;
  std::vector<float> scattered(n), reduced(n);
  for (size_t i = 0; i < n; ++i) scattered[i] = reduced[i] = rank_value(rank(), i);
  Tensor a = host_tensor(scattered), b = host_tensor(reduced);
  world().reduce_scatter_sum(a);
  world().allreduce_sum(b);
  const size_t first = size_t(rank()) * n / 2;
  for (size_t i = first; i < first + n / 2; ++i) EXPECT_EQ(scattered[i], reduced[i]) << i;
}

// ZeRO-1 overlapped with backward: buckets whose edges fall anywhere (inside a shard, on a
// shard edge, a bucket of one element, one spanning every shard) give each rank the blocking
// reduce-scatter's bits for its shard, for any world size; so does a communicator with 5
// elements per call, whose tiny scratch ring forces pieces and waits for the oldest.
TEST_F(MpiCommunicatorTest, StartedReduceScattersOfBucketsGiveTheBlockingReduceScattersBits) {
  const int64_t shard = 1001;
  const int64_t n = shard * world_size();
  std::vector<float> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i) values[i] = rank_value(rank(), i);
  std::vector<float> blocking = values;
  Tensor whole = host_tensor(blocking);
  world().reduce_scatter_sum(whole);
  // Last bucket first, as backward finishes them; they cover [0, n) exactly once.
  const std::vector<std::pair<int64_t, int64_t>> buckets = {
      {n - 7, n}, {shard + 3, n - 7}, {shard, shard + 3}, {shard - 1, shard}, {0, shard - 1}};
  MpiCommunicator chunked(/*max_elements_per_call=*/5);
  for (Communicator* comm : {&world(), static_cast<Communicator*>(&chunked)}) {
    std::vector<float> started = values;
    Tensor all = host_tensor(started);
    for (const auto& [begin, end] : buckets) {
      comm->start_reduce_scatter_sum(all, begin, end);
      comm->progress();
    }
    comm->wait_all();
    const size_t own = size_t(rank() * shard);
    EXPECT_EQ(
        std::memcmp(started.data() + own, blocking.data() + own, size_t(shard) * sizeof(float)), 0)
        << comm->name() << ": the bucketed reduce-scatter differs from the blocking one";
  }
  world().barrier();
}

TEST_F(MpiCommunicatorTest, StartedReduceScatterRefusesARangeOutsideTheTensor) {
  std::vector<float> storage(size_t(world_size()) * 4);
  Tensor t = host_tensor(storage);
  EXPECT_THROW(world().start_reduce_scatter_sum(t, 2, t.numel() + 1), Error);
  EXPECT_THROW(world().start_reduce_scatter_sum(t, 3, 2), Error);
  world().barrier();  // still in step: the checks threw before any collective
}

TEST_F(MpiCommunicatorTest, AllGatherGivesEveryRankEveryShard) {
  const size_t shard = 777;
  const size_t n = shard * size_t(world_size());
  for (size_t max_per_call : {MpiCommunicator::kDefaultMaxElementsPerCall, size_t{64}}) {
    MpiCommunicator comm(max_per_call);
    std::vector<float> values(n, NAN);  // only this rank's shard is set
    for (size_t i = 0; i < shard; ++i) {
      values[size_t(rank()) * shard + i] = rank_value(rank(), i);
    }
    Tensor t = host_tensor(values);
    comm.all_gather(t);
    for (int r = 0; r < world_size(); ++r) {
      for (size_t i = 0; i < shard; ++i) {
        EXPECT_EQ(values[size_t(r) * shard + i], rank_value(r, i)) << "rank " << r << " " << i;
      }
    }
    EXPECT_TRUE(identical_on_every_rank(values.data(), n * sizeof(float)));
  }
}

TEST_F(MpiCommunicatorTest, ShardCollectivesRefuseATensorThatDoesNotSplitEvenly) {
  std::vector<float> storage(size_t(world_size()) * 4 + 1);
  Tensor t = host_tensor(storage);
  EXPECT_THROW(world().reduce_scatter_sum(t), Error);
  EXPECT_THROW(world().all_gather(t), Error);
  world().barrier();  // still in step: the checks threw before any collective
}

TEST_F(MpiCommunicatorTest, BroadcastCopiesTheRootsBytes) {
  const int root = world_size() - 1;
  std::vector<char> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char((i * 7 + size_t(rank()) * 13) & 0x7f);
  world().broadcast(bytes.data(), bytes.size(), root);
  for (size_t i = 0; i < bytes.size(); ++i) {
    EXPECT_EQ(bytes[i], char((i * 7 + size_t(root) * 13) & 0x7f)) << "byte " << i;
  }
  // The same through a communicator that moves 64 bytes per call (16 chunks, last short).
  MpiCommunicator chunked(/*max_elements_per_call=*/64);
  std::vector<char> message(1000, char(rank()));
  chunked.broadcast(message.data(), message.size(), 0);
  EXPECT_EQ(message, std::vector<char>(1000, char(0)));
}

TEST_F(MpiCommunicatorTest, RejectsABroadcastRootOutsideTheWorld) {
  char byte = 0;
  EXPECT_THROW(world().broadcast(&byte, 1, world_size()), Error);
  EXPECT_THROW(world().broadcast(&byte, 1, -1), Error);
}

TEST_F(MpiCommunicatorTest, AllAgreeIsTrueOnlyWhenEveryRankHasTheSameValue) {
  EXPECT_TRUE(world().all_agree(0x9e3779b97f4a7c15ull));
  EXPECT_TRUE(world().all_agree(0));
  EXPECT_TRUE(world().all_agree(~0ull));
  EXPECT_FALSE(world().all_agree(static_cast<uint64_t>(rank())));
  // One rank differs, and the extremes of uint64 (where ~v tricks could wrap) disagree.
  EXPECT_FALSE(world().all_agree(rank() == world_size() - 1 ? 7 : 5));
  EXPECT_FALSE(world().all_agree(rank() == 0 ? 0 : ~0ull));
}

// The overlapped gradient sum (parallel/mpi_pending_sums.h): slices started one after another,
// progress() between them, one wait_all(): the bits of the blocking sum (two ranks: every
// element is one addition, so exactly; more ranks: identical on every rank), through the
// default chunk size and through 5-element chunks (so a slice is several reduce + broadcast
// pairs in flight at once).
TEST_F(MpiCommunicatorTest, StartedSumsGiveTheBlockingSumsBitsOnEveryRank) {
  const size_t n = 2053;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = rank_value(rank(), i) * 1e-3f + 1e4f;
  std::vector<float> blocking = values;
  Tensor whole = host_tensor(blocking);
  world().allreduce_sum(whole);
  MpiCommunicator chunked(/*max_elements_per_call=*/5);
  for (Communicator* comm : {&world(), static_cast<Communicator*>(&chunked)}) {
    std::vector<float> started = values;
    Tensor all = host_tensor(started);
    // Last slice first, as backward finishes them; uneven sizes; one of a single element.
    const std::vector<std::pair<int64_t, int64_t>> slices = {
        {1500, 553}, {1499, 1}, {700, 799}, {0, 700}};
    for (const auto& [offset, count] : slices) {
      comm->start_allreduce_sum(tensor_view(all, {count}, offset));
      comm->progress();
    }
    comm->wait_all();
    if (world_size() == 2) {
      EXPECT_EQ(std::memcmp(started.data(), blocking.data(), n * sizeof(float)), 0)
          << comm->name() << ": started sums differ from the blocking sum";
    }
    EXPECT_TRUE(identical_on_every_rank(started.data(), n * sizeof(float)));
  }
  // Nothing pending: wait_all returns at once, and blocking collectives still line up.
  world().wait_all();
  world().barrier();
}

TEST_F(MpiCommunicatorTest, StartedSumRejectsNonF32TensorsBeforeCommunicating) {
  std::vector<double> storage(4);
  Tensor t;
  t.data = storage.data();
  t.dtype = DType::F64;
  t.shape = {4};
  EXPECT_THROW(world().start_allreduce_sum(t), Error);
  world().barrier();
}

TEST_F(MpiCommunicatorTest, AutoChoosesMpiUnderAMultiProcessLaunch) {
  std::unique_ptr<Communicator> comm = make_communicator({"auto"});
  EXPECT_EQ(comm->name(), "mpi");
  EXPECT_EQ(comm->rank(), rank());
  EXPECT_EQ(comm->world_size(), world_size());
  EXPECT_THROW(make_communicator({"local"}), Error);
}

#ifdef GNMR_WITH_NCCL
// The NCCL id's handover under mpirun needs no GPU: ncclGetUniqueId works without one, and
// every rank must end with rank 0's 128 bytes (a rank with other bytes would wait at
// ncclCommInitRank until the deadline).
TEST_F(MpiCommunicatorTest, EveryRankGetsRankZerosNcclUniqueId) {
  CommunicatorOptions options;
  options.timeout_s = 30.0;
  const std::vector<uint8_t> id = share_nccl_unique_id(read_launch_env(), options, &world());
  ASSERT_EQ(id.size(), kNcclUniqueIdBytes);
  EXPECT_TRUE(identical_on_every_rank(id.data(), id.size()));
  EXPECT_NE(std::count(id.begin(), id.end(), uint8_t{0}), ptrdiff_t(id.size()));
}
#endif

}  // namespace
}  // namespace gnmr
