// The CUDA emulation's own promises (emulated_cuda.h): every thread of a grid runs once with its
// indices, barriers order shared-memory traffic, shuffles exchange across lanes, a barrier some
// threads skip and a launch a GPU would refuse are errors, shared memory starts as NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "emulated_cuda/emulated_cuda.h"

namespace gnmr::cuda {
namespace {

constexpr int kCudaErrorInvalidValue = 1, kCudaErrorInvalidConfiguration = 9;

// The emulation reports what would hang or be undefined on a GPU as std::logic_error.
void expect_logic_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a std::logic_error, nothing was thrown";
  } catch (const std::logic_error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" does not mention \"" << part << "\"";
    }
  }
}

TEST(EmulatedCuda, RunsEveryThreadOfA3dGridOnceWithItsIndices) {
  std::set<std::tuple<unsigned, unsigned, unsigned, unsigned, unsigned, unsigned>> seen;
  int runs = 0;
  emulated_kernel_launch(
      [&] {
        ++runs;
        EXPECT_EQ(gridDim.x, 3u);
        EXPECT_EQ(gridDim.y, 2u);
        EXPECT_EQ(blockDim.z, 2u);
        seen.emplace(blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
      },
      nullptr, EmulatedDim(3, 2, 1), EmulatedDim(5, 3, 2));
  EXPECT_EQ(runs, 3 * 2 * 5 * 3 * 2);
  EXPECT_EQ(seen.size(), size_t(runs));  // no index pair twice
  EXPECT_EQ(emulated_take_launch_error(true), 0);
}

// Each thread writes its slot, waits, then reads its neighbour's: without the barrier a thread
// would read a slot not yet written (NaN, as shared memory starts).
TEST(EmulatedCuda, SyncthreadsOrdersSharedMemoryAndSharedMemoryStartsAsNan) {
  const int threads = 96;
  std::vector<float> read(threads, 0.0f), before(threads, 0.0f);
  emulated_kernel_launch(
      [&] {
        float* shared = emulated_shared_memory();
        const int t = int(threadIdx.x);
        before[size_t(t)] = shared[(t + 1) % threads];
        emulated_syncthreads();
        shared[t] = float(t);
        emulated_syncthreads();
        read[size_t(t)] = shared[(t + 1) % threads];
      },
      nullptr, 1, threads, threads * sizeof(float));
  for (int t = 0; t < threads; ++t) {
    EXPECT_TRUE(std::isnan(before[size_t(t)])) << t;
    EXPECT_EQ(read[size_t(t)], float((t + 1) % threads)) << t;
  }
}

TEST(EmulatedCuda, AButterflyOfShufflesGivesEveryLaneTheWarpsSum) {
  std::vector<double> sums(64, 0.0);
  emulated_kernel_launch(
      [&] {
        double value = threadIdx.x + 1;
        for (int offset = 16; offset > 0; offset >>= 1) {
          value += warp_shuffle_xor(0xFFFFFFFFu, value, offset);
        }
        sums[threadIdx.x] = value;
      },
      nullptr, 1, 64);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(sums[size_t(t)], t < 32 ? 528.0 : 1552.0) << t;
}

TEST(EmulatedCuda, ABarrierSomeThreadsNeverReachIsAnErrorNamingTheBlock) {
  const auto skipped_by_half = [] {
    if (threadIdx.x % 2 == 0) emulated_syncthreads();
  };
  expect_logic_error([&] { emulated_kernel_launch(skipped_by_half, nullptr, 2, 64); },
                     {"block (0, 0, 0)", "32 wait at __syncthreads", "32 returned"});
  // A shuffle in a warp the block leaves partial (48 threads: the second warp has 16).
  expect_logic_error(
      [] {
        emulated_kernel_launch([] { (void)warp_shuffle_xor(0xFFFFFFFFu, 1.0f, 1); }, nullptr, 1,
                               48);
      },
      {"__shfl_xor_sync in a warp of 16 threads"});
}

TEST(EmulatedCuda, ALaunchAGpuWouldRefuseRunsNothingAndLeavesTheError) {
  int runs = 0;
  const auto kernel = [&] { ++runs; };
  const int kernel_id = 0;  // any address names the kernel to cudaFuncSetAttribute's record
  emulated_kernel_launch(kernel, &kernel_id, 1, 1025);
  EXPECT_EQ(emulated_take_launch_error(true), kCudaErrorInvalidConfiguration);
  EXPECT_NE(std::string(emulated_launch_error_text()).find("1024 threads"), std::string::npos);
  emulated_kernel_launch(kernel, &kernel_id, 0, 32);
  EXPECT_EQ(emulated_take_launch_error(true), kCudaErrorInvalidConfiguration);
  emulated_kernel_launch(kernel, &kernel_id, EmulatedDim(1, 65536), 32);
  EXPECT_EQ(emulated_take_launch_error(true), kCudaErrorInvalidConfiguration);
  emulated_kernel_launch(kernel, &kernel_id, int64_t{-1}, 32);  // a negative grid size
  EXPECT_EQ(emulated_take_launch_error(true), kCudaErrorInvalidConfiguration);
  // Above 48 KiB of dynamic shared memory only after cudaFuncSetAttribute raised the limit.
  emulated_kernel_launch(kernel, &kernel_id, 1, 32, 64 * 1024);
  EXPECT_EQ(emulated_take_launch_error(true), kCudaErrorInvalidValue);
  EXPECT_EQ(runs, 0);
  emulated_set_max_dynamic_shared_bytes(&kernel_id, 64 * 1024);
  emulated_kernel_launch(kernel, &kernel_id, 1, 32, 64 * 1024);
  EXPECT_EQ(emulated_take_launch_error(true), 0);
  EXPECT_EQ(runs, 32);
}

}  // namespace
}  // namespace gnmr::cuda
