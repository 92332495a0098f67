// The emulated NCCL (emulated_nccl.cpp) refuses what NCCL refuses, with ncclGetLastError saying
// why: a host pointer as a buffer, overlapping buffers that are not the in-place form, a root
// out of range, a config NCCL_CONFIG_INITIALIZER did not make, two ranks on one device. Loaded
// through gnmr's own loader, which takes it in an emulated build (and only there). The sums of
// 2 and 3 ranks are tests/gpu/test_gpu_nccl.cpp's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "parallel/nccl_library.h"

namespace gnmr {
namespace {

const NcclApi& api() {
  static const NcclApi loaded = load_nccl_api({nccl_build_library()});
  return loaded;
}

struct OneRankComm {
  ncclComm_t comm = nullptr;
  OneRankComm() {
    ncclUniqueId id;
    EXPECT_EQ(api().GetUniqueId(&id), ncclSuccess);
    EXPECT_EQ(api().CommInitRankConfig(&comm, 1, id, 0, nullptr), ncclSuccess);  // blocking
  }
  ~OneRankComm() {
    if (comm != nullptr) api().CommDestroy(comm);
  }
};

std::string last_error(ncclComm_t comm) {
  return api().GetLastError(comm);
}

TEST(EmulatedNccl, IsTheLibraryOfAnEmulatedBuildAndHasTheHeadersVersion) {
  EXPECT_EQ(api().version, NCCL_VERSION_CODE);
  EXPECT_NE(api().path.find("gnmr_emulated_nccl"), std::string::npos) << api().path;
}

TEST(EmulatedNccl, OneRankReducesInPlaceAndOutOfPlace) {
  OneRankComm r;
  ASSERT_NE(r.comm, nullptr) << last_error(nullptr);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 8 * sizeof(float)), cudaSuccess);
  const std::vector<float> values = {1, -2, 3.5f, 4};
  ASSERT_EQ(cudaMemcpy(d, values.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(api().AllReduce(d, d, 4, ncclFloat32, ncclSum, r.comm, nullptr), ncclSuccess);
  EXPECT_EQ(api().AllReduce(d, d + 4, 4, ncclFloat32, ncclMax, r.comm, nullptr), ncclSuccess);
  std::vector<float> back(8);
  ASSERT_EQ(cudaMemcpy(back.data(), d, 32, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, (std::vector<float>{1, -2, 3.5f, 4, 1, -2, 3.5f, 4}));
  EXPECT_EQ(api().AllReduce(d, d, 0, ncclFloat32, ncclSum, r.comm, nullptr), ncclSuccess);
  cudaFree(d);
}

TEST(EmulatedNccl, RefusesHostBuffersOverlapsAndBadRootsWithAReason) {
  OneRankComm r;
  ASSERT_NE(r.comm, nullptr) << last_error(nullptr);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 8 * sizeof(float)), cudaSuccess);
  std::vector<float> host(8, 1.0f);
  EXPECT_EQ(api().AllReduce(host.data(), host.data(), 8, ncclFloat32, ncclSum, r.comm, nullptr),
            ncclInvalidArgument);
  EXPECT_NE(last_error(r.comm).find("not device memory"), std::string::npos) << last_error(r.comm);
  // Past the end of the allocation.
  EXPECT_EQ(api().AllReduce(d + 1, d + 1, 8, ncclFloat32, ncclSum, r.comm, nullptr),
            ncclInvalidArgument);
  // Overlapping, but not the same buffer.
  EXPECT_EQ(api().AllReduce(d, d + 2, 4, ncclFloat32, ncclSum, r.comm, nullptr),
            ncclInvalidArgument);
  EXPECT_NE(last_error(r.comm).find("in-place"), std::string::npos) << last_error(r.comm);
  EXPECT_EQ(api().Broadcast(d, d, 4, ncclFloat32, 1, r.comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(last_error(r.comm).find("root 1"), std::string::npos) << last_error(r.comm);
  EXPECT_EQ(api().AllReduce(d, d, 4, ncclBfloat16, ncclSum, r.comm, nullptr), ncclInvalidArgument);
  // A refused call leaves the communicator usable.
  EXPECT_EQ(api().AllReduce(d, d, 8, ncclFloat32, ncclSum, r.comm, nullptr), ncclSuccess);
  cudaFree(d);
}

TEST(EmulatedNccl, RefusesAConfigNotMadeByTheInitializerAndAForeignId) {
  ncclUniqueId id;
  ASSERT_EQ(api().GetUniqueId(&id), ncclSuccess);
  ncclConfig_t config{};  // not NCCL_CONFIG_INITIALIZER
  ncclComm_t comm = nullptr;
  EXPECT_EQ(api().CommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(last_error(nullptr).find("NCCL_CONFIG_INITIALIZER"), std::string::npos);
  ncclUniqueId foreign{};
  EXPECT_EQ(api().CommInitRankConfig(&comm, 1, foreign, 0, nullptr), ncclInvalidArgument);
  EXPECT_EQ(api().CommInitRankConfig(&comm, 2, id, 2, nullptr), ncclInvalidArgument);
}

// Two processes, both on device 0 (this process's, forked): NCCL's "duplicate GPU". Non-blocking,
// so each polls the join as gnmr's communicator does.
TEST(EmulatedNccl, TwoRanksOnOneDeviceAreRefused) {
  ncclUniqueId id;
  ASSERT_EQ(api().GetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const auto join = [&](int rank) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t state = api().CommInitRankConfig(&comm, 2, id, rank, &config);
    for (int polls = 0; state == ncclInProgress && polls < 200000; ++polls) {
      usleep(50);
      api().CommGetAsyncError(comm, &state);
    }
    const std::string why = comm != nullptr ? last_error(comm) : "";
    if (comm != nullptr) api().CommAbort(comm);
    return std::make_pair(state, why);
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(join(1).first == ncclInvalidUsage ? 0 : 1);
  const auto [state, why] = join(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the other rank was not refused";
  // This rank may see the other's refusal first (it aborts): either way the join fails.
  EXPECT_TRUE(state == ncclInvalidUsage || state == ncclRemoteError) << state << " " << why;
  if (state == ncclInvalidUsage) {
    EXPECT_NE(why.find("both on CUDA device 0"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace gnmr
