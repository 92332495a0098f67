// The nccl communicator with one rank, the most one GPU can run (two ranks on one device are
// not supported by NCCL): creation through make_communicator, an in-place all-reduce that is
// the identity, the host collectives through the staging buffer (chunked broadcast included),
// and abort ending the process with the code it was given. Two-rank equivalence needs a
// machine with two GPUs (docs/DESIGN.md §7).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "parallel/communicator.h"
#include "parallel/launch_env.h"
#include "parallel/nccl_library.h"
#include "tests/gpu/gpu_test_util.h"
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

}  // namespace
}  // namespace gnmr
