// The nccl communicator (docs/DESIGN.md §7). With one rank, the most one GPU can run (two
// ranks on one device are not supported by NCCL): creation through make_communicator, an
// in-place all-reduce that is the identity, the host collectives through the staging buffer
// (chunked broadcast included), and abort ending the process with the code it was given. With
// two and three ranks (as many GPUs, or the emulation's), processes running nccl_rank_check.h:
// every collective's sums, and the ends of a run whose rank dies, aborts or never joins.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "parallel/communicator.h"
#include "parallel/launch_env.h"
#include "parallel/nccl_library.h"
#include "tests/cli_runner.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/nccl_rank_check.h"
#include "util/error.h"

namespace gnmr {
namespace {

struct OneRank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
};

// NCCL is loaded at run time (parallel/nccl_library.h): where none can be, the tests skip with
// the loader's reasons (scripts/gpu_check.sh counts a skip on a GPU machine as a failure).
#define SKIP_WITHOUT_NCCL()     \
  do {                          \
    try {                       \
      nccl_api();               \
    } catch (const Error& e) {  \
      GTEST_SKIP() << e.what(); \
    }                           \
  } while (0)

OneRank make_one_rank() {
  OneRank r;
  r.backend = make_cuda_backend(CudaBackendOptions{});
  CommunicatorOptions options;
  options.kind = "nccl";
  options.backend = "cuda";
  options.timeout_s = 60;
  const CudaStreamHandle handle = cuda_stream_of(*r.backend);
  options.cuda_device = handle.device;
  options.cuda_stream = handle.stream;
  r.comm = make_communicator(options, LaunchEnv{});
  return r;
}

TEST(GpuNccl, OneRankAllReduceIsTheIdentityAndHostCollectivesWork) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  OneRank r = make_one_rank();
  EXPECT_EQ(r.comm->name(), "nccl");
  EXPECT_EQ(r.comm->rank(), 0);
  EXPECT_EQ(r.comm->world_size(), 1);

  const std::vector<float> values = gnmr_test::random_normal(10007, 5);
  Tensor t = r.backend->allocate("grads", {10007}, DType::F32, MemoryRole::Gradients);
  r.backend->copy_from_host(t, values.data());
  r.comm->allreduce_sum(t);
  r.comm->wait_for_collectives();
  std::vector<float> back(values.size());
  r.backend->copy_to_host(t, back.data());
  EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * sizeof(float)), 0);

  double sums[3] = {1.5, -2.25, 1e300};
  r.comm->allreduce_sum(sums, 3);
  EXPECT_EQ(sums[0], 1.5);
  EXPECT_EQ(sums[1], -2.25);
  EXPECT_EQ(sums[2], 1e300);

  std::vector<uint8_t> bytes(3 * (size_t{1} << 20) + 17);  // more than one staging chunk
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 131 + 7);
  const std::vector<uint8_t> sent = bytes;
  r.comm->broadcast(bytes.data(), bytes.size(), 0);
  EXPECT_EQ(bytes, sent);
  EXPECT_TRUE(r.comm->all_agree(0x1234abcdULL));
  r.comm->barrier();

  // A checkpoint's scope has its own deadline, and the collectives in it still work.
  EXPECT_EQ(r.comm->timeout_s(), 60.0);
  {
    CommunicatorTimeoutScope file_waits(*r.comm, 3600.0);
    EXPECT_EQ(r.comm->timeout_s(), 3600.0);
    r.comm->barrier();
  }
  EXPECT_EQ(r.comm->timeout_s(), 60.0);
}

// NCCL_COMM_BLOCKING=1 overrides the communicator's non-blocking config inside NCCL: a
// collective whose peer died would then hang in the call, where no deadline reaches it.
TEST(GpuNccl, NcclCommBlockingIsRefusedBecauseItWouldDefeatTheDeadline) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  struct EnvGuard {
    EnvGuard() { setenv("NCCL_COMM_BLOCKING", "1", 1); }
    ~EnvGuard() { unsetenv("NCCL_COMM_BLOCKING"); }
  } blocking;
  try {
    make_one_rank();
    FAIL() << "a communicator was made under NCCL_COMM_BLOCKING=1";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("NCCL_COMM_BLOCKING=1"), std::string::npos) << message;
    EXPECT_NE(message.find("dist.timeout_s"), std::string::npos) << message;
  }
}

// ZeRO-1's collectives and the overlapped ones with one rank: each is the identity, and the
// overlapped ones, queued on the communication stream between backend ops on the backend's
// stream (a scale before, which they must follow, and one after, which must follow wait_all),
// leave exactly what the two scales give. Every call's NCCL and CUDA returns are checked on the
// device, which is what one GPU can show; the sums themselves need two (test_gpu_data_parallel).
TEST(GpuNccl, OneRankReduceScatterAllGatherAndOverlappedReductionsKeepTheValues) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  OneRank r = make_one_rank();
  const size_t n = 3 * 64 * 1000 + 64;  // ZeRO-1 pads to whole 64-element shards
  const std::vector<float> values = gnmr_test::random_normal(n, 11);
  Tensor t = r.backend->allocate("flat", {int64_t(n)}, DType::F32, MemoryRole::Gradients);
  r.backend->copy_from_host(t, values.data());
  r.comm->reduce_scatter_sum(t);
  r.comm->all_gather(t);
  r.backend->scale(t, 2.0f);
  // Buckets as the session starts them: last elements first, one crossing nothing, one empty.
  r.comm->start_allreduce_sum(tensor_view(t, {int64_t(n) - 5000}, 5000));
  r.comm->start_allreduce_sum(tensor_view(t, {5000}, 0));
  r.comm->start_reduce_scatter_sum(t, 100, int64_t(n));
  r.comm->start_reduce_scatter_sum(t, 0, 100);
  r.comm->start_reduce_scatter_sum(t, 7, 7);
  r.comm->wait_all();
  r.backend->scale(t, 3.0f);
  r.comm->wait_for_collectives();
  std::vector<float> back(n);
  r.backend->copy_to_host(t, back.data());
  size_t differing = 0;
  for (size_t i = 0; i < n; ++i) {
    const float expected = (values[i] * 2.0f) * 3.0f;
    if (std::memcmp(&back[i], &expected, sizeof(float)) != 0) ++differing;
  }
  EXPECT_EQ(differing, 0u);
  EXPECT_THROW(r.comm->start_reduce_scatter_sum(t, 0, int64_t(n) + 1), Error);
}

TEST(GpuNcclDeathTest, AbortEndsTheProcessWithItsCode) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        OneRank r = make_one_rank();
        r.comm->abort(3);
      },
      ::testing::ExitedWithCode(3), "");
}

// The multi-process checks need a GPU per rank: their names say TwoGpus, which
// scripts/gpu_check.sh leaves out on a machine with one (where a skip would count as a failure).
#define SKIP_WITHOUT_GPUS(ranks)        \
  if (gnmr_test::gpu_count() < (ranks)) \
  GTEST_SKIP() << "needs " << (ranks) << " GPUs (" << gnmr_test::gpu_count() << " visible)"

// A rank of the checks: this test binary started again with GNMR_NCCL_RANK_CHECK=MODE, running
// only the disabled test below (so that ctest and gpu_check.sh never run it on its own). Its
// exit code is the rank's result (nccl_rank_check.h).
gnmr_test::RanksResult run_rank_check(int ranks, const std::string& mode) {
  const std::string dir = gnmr_test::scratch_dir("nccl_ranks_" + mode);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return gnmr_test::run_ranks(self, ranks,
                              "--gtest_filter=GpuNcclRanks.DISABLED_OneRankOfAMultiProcessCheck "
                              "--gtest_also_run_disabled_tests",
                              dir + "/" + std::to_string(ranks) + "_ranks", 120,
                              "GNMR_NCCL_RANK_CHECK=" + mode);
}

TEST(GpuNcclRanks, DISABLED_OneRankOfAMultiProcessCheck) {
  const char* mode = std::getenv("GNMR_NCCL_RANK_CHECK");
  ASSERT_NE(mode, nullptr) << "started by the GpuNcclRanks tests, with GNMR_NCCL_RANK_CHECK";
  const int code = nccl_rank_check(mode);
  std::fflush(stdout);
  std::_Exit(code);
}

// Three ranks too: the sum of three addends is where an order of additions could show (here the
// inputs make every order exact, so any difference is a wrong sum).
TEST(GpuNcclRanks, TwoGpusEveryCollectiveSumsExactlyOnTwoAndThreeRanks) {
  SKIP_WITHOUT_GPUS(2);
  SKIP_WITHOUT_NCCL();
  for (int ranks : {2, 3}) {
    if (ranks > gnmr_test::gpu_count()) break;  // two GPUs run the two-rank half
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const gnmr_test::RanksResult r = run_rank_check(ranks, "collectives");
    EXPECT_TRUE(r.all_succeeded()) << r.output;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string done = "rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                               ": every collective checked";
      EXPECT_NE(r.output.find(done), std::string::npos) << r.output;
    }
  }
}

// A rank that dies (a crash, a killed node) or aborts mid-run: the other ends with an error that
// names its rank and the collective, within its 10 s deadline (the run's 120 s bound is the
// hang). NCCL may report the peer as gone or leave the call to the deadline; both are an end.
TEST(GpuNcclRanks, TwoGpusARankThatDiesOrAbortsEndsTheOtherWithAnErrorNotAHang) {
  SKIP_WITHOUT_GPUS(2);
  SKIP_WITHOUT_NCCL();
  for (const char* mode : {"exit", "abort"}) {
    SCOPED_TRACE(mode);
    const gnmr_test::RanksResult r = run_rank_check(2, mode);
    ASSERT_EQ(r.exit_codes.size(), 2u);
    EXPECT_EQ(r.exit_codes[1], std::string(mode) == "exit" ? 9 : 4) << r.output;
    EXPECT_EQ(r.exit_codes[0], 3) << r.output;
    EXPECT_NE(r.output.find("error: rank 0 of 2: NCCL "), std::string::npos) << r.output;
    const bool reported = r.output.find("failed: remote process exited") != std::string::npos ||
                          r.output.find("did not finish within 10 s") != std::string::npos;
    EXPECT_TRUE(reported) << r.output;
  }
}

TEST(GpuNcclRanks, TwoGpusARankThatNeverJoinsEndsCommunicatorCreationAtTheDeadline) {
  SKIP_WITHOUT_GPUS(2);
  SKIP_WITHOUT_NCCL();
  const gnmr_test::RanksResult r = run_rank_check(2, "absent");
  ASSERT_EQ(r.exit_codes.size(), 2u);
  EXPECT_EQ(r.exit_codes[1], 0) << r.output;
  EXPECT_EQ(r.exit_codes[0], 3) << r.output;
  EXPECT_NE(r.output.find("communicator creation (waiting for every rank to join) did not "
                          "finish within 10 s"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gnmr
