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
