// The CUDA emulation's own promises (emulated_cuda.h): every thread of a grid runs once with its
// indices, barriers order shared-memory traffic, shuffles exchange across lanes, ldmatrix
// delivers each lane its elements, cp.async copies land at the wait for their group, a barrier
// some threads skip, an ldmatrix row or a cp.async a GPU could not do, a thread that leaves
// copies unwaited and a launch a GPU would refuse are errors, shared memory starts as NaN; a
// wgmma's product lands at its wait and its shared operands may not be written until then.
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

#include "backend/mma_fragment.h"
#include "backend/wgmma_operand.h"
#include "emulated_cuda/emulated_cuda.h"
#include "precision/bf16.h"

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

// Four 8 x 8 matrices, matrix j's (row, col) holding the code 256 j + 16 row + col, stored with
// their rows in reverse order and 24 elements apart (the addresses, not the layout, say which
// row is which). Each lane must receive, in register j, the two elements the ISA's rule
// (mma_fragment.h) gives it; a write after the ldmatrix must not reach what the warp received.
TEST(EmulatedCuda, LdmatrixGivesEachLaneItsElementsAsTheInstructionFoundThem) {
  constexpr int kStride = 24;
  for (bool trans : {false, true}) {
    std::vector<uint32_t> got(32 * 4, 0);
    emulated_kernel_launch(
        [&] {
          auto* tile = reinterpret_cast<uint16_t*>(emulated_shared_memory());
          const int lane = int(threadIdx.x);
          if (lane == 0) {
            for (int j = 0; j < 4; ++j) {
              for (int row = 0; row < 8; ++row) {
                for (int col = 0; col < 8; ++col) {
                  tile[(8 * j + 7 - row) * kStride + col] = uint16_t(256 * j + 16 * row + col);
                }
              }
            }
          }
          emulated_syncthreads();
          const uint16_t* row = tile + (8 * (lane / 8) + 7 - lane % 8) * kStride;
          uint32_t r[4];
          if (trans) {
            ldmatrix_x4_trans(r, row);
          } else {
            ldmatrix_x4(r, row);
          }
          tile[lane] = 0xFFFF;  // lands after the load: the other lanes' registers keep the codes
          for (int j = 0; j < 4; ++j) got[size_t(4 * lane + j)] = r[j];
        },
        nullptr, 1, 32, 32 * kStride * sizeof(uint16_t));
    ASSERT_EQ(emulated_take_launch_error(true), 0);
    for (int lane = 0; lane < 32; ++lane) {
      for (int j = 0; j < 4; ++j) {
        const auto code = [&](int half) {
          return uint16_t(256 * j + 16 * ldmatrix_element_row(lane, half, trans) +
                          ldmatrix_element_col(lane, half, trans));
        };
        EXPECT_EQ(got[size_t(4 * lane + j)], pack_bf16_pair(code(0), code(1)))
            << "trans " << trans << " lane " << lane << " matrix " << j;
      }
    }
  }
}

TEST(EmulatedCuda, AnLdmatrixRowOffA16ByteBoundaryOrOutsideSharedMemoryIsAnError) {
  const auto load_at = [](int64_t offset) {
    return [offset] {
      uint32_t r[4];
      ldmatrix_x4(r, reinterpret_cast<const uint16_t*>(emulated_shared_memory()) + offset +
                         8 * (threadIdx.x % 32));
    };
  };
  emulated_kernel_launch(load_at(0), nullptr, 1, 32, 512);  // 32 rows of 16 bytes: all inside
  EXPECT_EQ(emulated_take_launch_error(true), 0);
  expect_logic_error([&] { emulated_kernel_launch(load_at(4), nullptr, 1, 32, 1024); },
                     {"ldmatrix.x4", "lane 0", "not 16-byte aligned", "byte 8"});
  expect_logic_error([&] { emulated_kernel_launch(load_at(8), nullptr, 1, 32, 512); },
                     {"ldmatrix.x4", "lane 31", "outside the block's dynamic shared memory"});
}

// Two groups of copies: the first (four floats, then a zero-filled chunk, 16 bytes each) lands
// at wait_group<1>, the second (two floats and two zero-filled ones 4 bytes at a time, then
// four floats 16 bytes at a time) only at wait_group<0>; before its wait a float still holds the
// NaN shared memory starts with. No two copies write the same bytes (undefined in PTX).
TEST(EmulatedCuda, CpAsyncCopiesLandWhenTheirGroupIsWaitedFor) {
  alignas(16) static const float source[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  constexpr int kFloats = 16;
  std::vector<float> seen;
  emulated_kernel_launch(
      [&] {
        float* shared = emulated_shared_memory();
        cp_async_16(shared, source, 16);
        cp_async_16(shared + 4, source, 0);  // zero-fill
        cp_async_commit_group();
        cp_async_4(shared + 8, source + 4, 4);
        cp_async_4(shared + 9, source + 5, 4);
        cp_async_4(shared + 10, source + 6, 0);  // zero-fill
        cp_async_4(shared + 11, source + 7, 0);
        cp_async_16(shared + 12, source + 4, 16);
        cp_async_commit_group();
        seen.assign(shared, shared + kFloats);  // nothing landed yet
        cp_async_wait_group<1>();
        seen.insert(seen.end(), shared, shared + kFloats);
        cp_async_wait_group<0>();
        seen.insert(seen.end(), shared, shared + kFloats);
      },
      nullptr, 1, 1, kFloats * sizeof(float));
  ASSERT_EQ(emulated_take_launch_error(true), 0);
  ASSERT_EQ(seen.size(), size_t(3 * kFloats));
  for (int i = 0; i < kFloats; ++i) EXPECT_TRUE(std::isnan(seen[size_t(i)])) << i;
  const std::vector<float> after_first(seen.begin() + kFloats, seen.begin() + kFloats + 8);
  EXPECT_EQ(after_first, (std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0}));
  for (int i = kFloats + 8; i < 2 * kFloats; ++i) EXPECT_TRUE(std::isnan(seen[size_t(i)])) << i;
  const std::vector<float> after_all(seen.begin() + 2 * kFloats, seen.end());
  EXPECT_EQ(after_all, (std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 0, 0, 5, 6, 7, 8}));
}

TEST(EmulatedCuda, ACpAsyncAGpuCouldNotDoOrNeverWaitedForIsAnError) {
  alignas(16) static const float source[8] = {};
  expect_logic_error(
      [&] {
        emulated_kernel_launch([] { cp_async_16(emulated_shared_memory() + 1, source, 16); },
                               nullptr, 1, 1, 64);
      },
      {"cp.async of 16 bytes", "off a 16-byte boundary"});
  expect_logic_error(
      [&] {
        emulated_kernel_launch([] { cp_async_4(emulated_shared_memory(), source + 1, 2); }, nullptr,
                               1, 1, 64);
      },
      {"cp.async of 4 bytes", "source size"});
  expect_logic_error(
      [&] {
        emulated_kernel_launch([] { cp_async_16(emulated_shared_memory() + 16, source, 16); },
                               nullptr, 1, 1, 64);
      },
      {"cp.async", "outside the block's dynamic shared memory"});
  expect_logic_error(
      [&] {
        emulated_kernel_launch(
            [] {
              cp_async_16(emulated_shared_memory(), source, 16);
              cp_async_commit_group();
            },
            nullptr, 1, 1, 64);
      },
      {"thread (0, 0, 0)", "returned with cp.async copies it never waited for"});
}

// Races through shared memory between cp.async and ldmatrix (or a 16-byte load), in a block of
// two warps over 32 rows of 16 bytes. The fibers run in thread order between barriers, so the warp
// that goes first is the one that acts first. Each race is reported; the same steps with the
// barrier a GPU needs are not.
TEST(EmulatedCuda, ACpAsyncAndAnLdmatrixOfOtherThreadsWithNoBarrierBetweenAreARace) {
  alignas(16) static const float source[4] = {1, 2, 3, 4};
  constexpr size_t kShared = 32 * 16;
  const auto rows = [] { return reinterpret_cast<uint16_t*>(emulated_shared_memory()); };
  const auto read_rows = [&] {
    uint32_t r[4];
    ldmatrix_x4(r, rows() + 8 * (threadIdx.x % 32));
  };
  const auto copy_row_0 = [&] {
    cp_async_16(rows(), source, 16);
    cp_async_commit_group();
  };
  enum class Race {
    kWriteAfterRead,
    kReadAfterLanding,
    kReadBeforeLanding,
    kTwoWrites,
    kVectorLoadAfterLanding
  };
  // barrier: the __syncthreads that orders the two sides.
  const auto kernel = [&](Race race, bool barrier) {
    return [=] {
      const int t = int(threadIdx.x);
      switch (race) {
        case Race::kWriteAfterRead:  // warp 0 reads; then thread 32 copies over row 0
          if (t < 32) read_rows();
          if (barrier) emulated_syncthreads();
          if (t == 32) copy_row_0(), cp_async_wait_group<0>();
          break;
        case Race::kReadAfterLanding:  // thread 0 copies and waits; then warp 1 reads
          if (t == 0) copy_row_0(), cp_async_wait_group<0>();
          if (barrier) emulated_syncthreads();
          if (t >= 32) read_rows();
          break;
        case Race::kReadBeforeLanding:  // warp 1 reads between thread 0's copy and its wait
          if (t == 0) copy_row_0();
          emulated_syncthreads();
          if (t == 0 && barrier) cp_async_wait_group<0>();
          if (barrier) emulated_syncthreads();
          if (t >= 32) read_rows();
          emulated_syncthreads();
          if (t == 0 && !barrier) cp_async_wait_group<0>();
          break;
        case Race::kTwoWrites:  // threads 0 and 32 both copy to row 0
          if (t == 0) copy_row_0(), cp_async_wait_group<0>();
          if (barrier) emulated_syncthreads();
          if (t == 32) copy_row_0(), cp_async_wait_group<0>();
          break;
        case Race::kVectorLoadAfterLanding: {  // thread 0 copies and waits; then thread 32 loads
          if (t == 0) copy_row_0(), cp_async_wait_group<0>();
          if (barrier) emulated_syncthreads();
          float v[4];
          if (t == 32) load_float4(emulated_shared_memory(), v);
          break;
        }
      }
    };
  };
  const auto launch = [&](Race race, bool barrier) {
    emulated_kernel_launch(kernel(race, barrier), nullptr, 1, 64, kShared);
  };
  expect_logic_error(
      [&] { launch(Race::kWriteAfterRead, false); },
      {"thread (32, 0, 0)", "cp.async of 16 bytes overwrites byte 0",
       "which thread 0 read (ldmatrix, wgmma or a vector load) with no __syncthreads between"});
  expect_logic_error([&] { launch(Race::kReadAfterLanding, false); },
                     {"thread (32, 0, 0)", "ldmatrix.x4 (lane 0) reads byte 0",
                      "thread 0's cp.async wrote with no __syncthreads between its wait"});
  expect_logic_error([&] { launch(Race::kReadBeforeLanding, false); },
                     {"ldmatrix.x4 (lane 0) reads byte 0", "thread 0's cp.async is still writing"});
  expect_logic_error([&] { launch(Race::kTwoWrites, false); },
                     {"thread (32, 0, 0)", "writes byte 0",
                      "thread 0's cp.async also writes with no __syncthreads between"});
  expect_logic_error([&] { launch(Race::kVectorLoadAfterLanding, false); },
                     {"thread (32, 0, 0)", "a 16-byte load (lane 0) reads byte 0",
                      "thread 0's cp.async wrote with no __syncthreads between its wait"});
  for (Race race : {Race::kWriteAfterRead, Race::kReadAfterLanding, Race::kReadBeforeLanding,
                    Race::kTwoWrites, Race::kVectorLoadAfterLanding}) {
    launch(race, true);
    EXPECT_EQ(emulated_take_launch_error(true), 0) << int(race);
  }
}

// A wgmma (sm_90a's warpgroup MMA) by one warpgroup over two 64 x 16 bf16 tiles, A at byte 0
// and B at byte 2048 of shared memory, laid out as wgmma_tile_element places them: D = A B^T
// lands at the wait, and the tensor cores' reads of A and B last from the issue until then, so a
// copy over B before it, even after a barrier, and another thread's copy over A after it with no
// barrier between are races; the same copy after the wait and a barrier is not. The copies
// reach the wgmma only through each copying thread's fence.proxy.async, the wgmma needs a
// wgmma.fence before it, and every thread of the warpgroup issues the same one.
TEST(EmulatedCuda, AWgmmaLandsAtItsWaitReadsItsSharedOperandsUntilThenAndIsTheWarpgroups) {
  constexpr int kRows = 64, kCols = 16, kTileBytes = kRows * kCols * 2;
  static float a[kRows][kCols], b[kRows][kCols];
  alignas(16) static uint16_t staged[2][kRows * kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      a[r][c] = float((r * 7 + c * 3) % 11 - 5);  // small integers: exact in bf16 and in D
      b[r][c] = float((r * 5 + c) % 9 - 4);
      staged[0][wgmma_tile_element(r, c, kCols)] = encode_bf16(a[r][c]);
      staged[1][wgmma_tile_element(r, c, kCols)] = encode_bf16(b[r][c]);
    }
  }
  // The faults: a copy over the operands at one of three points (kCopy...), a missing fence
  // (kNoProxyFence: the tiles' copies not fenced for the async proxy; kNoWgmmaFence: no
  // wgmma.fence), warp 3 not issuing the wgmma or issuing it with another B.
  enum class Fault {
    kNone,
    kNoProxyFence,
    kNoWgmmaFence,
    kCopyBeforeTheWait,
    kCopyAfterABarrierBeforeTheWait,
    kCopyAfterTheWait,
    kWarp3Skips,
    kWarp3ReadsAnotherB
  };
  static float d_seen[kRows][kRows];
  const auto kernel = [&](Fault fault, bool barrier) {
    return [=] {
      const int t = int(threadIdx.x), lane = t % kWarpSize, warp = t / kWarpSize;
      unsigned char* shared = reinterpret_cast<unsigned char*>(emulated_shared_memory());
      for (int chunk = t; chunk < 2 * kTileBytes / 16; chunk += 128) {
        cp_async_16(shared + 16 * chunk,
                    reinterpret_cast<const unsigned char*>(staged) + 16 * chunk, 16);
      }
      cp_async_commit_group();
      cp_async_wait_group<0>();
      if (fault != Fault::kNoProxyFence) fence_proxy_async_shared();
      emulated_syncthreads();
      float d[kWgmmaN / kMmaN][kMmaCElements];
      if (fault != Fault::kNoWgmmaFence) wgmma_fence();
      const bool other_b = fault == Fault::kWarp3ReadsAnotherB && warp == 3;
      if (fault != Fault::kWarp3Skips || warp != 3) {
        wgmma_m64n64k16_ss(
            d, wgmma_scores_operand(shared_space_address(shared), kCols),
            wgmma_scores_operand(shared_space_address(shared + (other_b ? 0 : kTileBytes)), kCols),
            0);
      }
      wgmma_commit_group();
      const auto copy_over = [&](int tile) {
        cp_async_16(shared + tile * kTileBytes, staged[tile], 16);
        cp_async_commit_group();
        cp_async_wait_group<0>();
      };
      // Thread 0 reads B's first word itself (lanes 0-3 of every warp read B's column 0), and
      // A's row 0 is read by threads 0-3 only: thread 31 copies over it once they have waited
      // (the __syncwarp), and a GPU still needs a __syncthreads between.
      if (fault == Fault::kCopyBeforeTheWait && t == 0) copy_over(1);
      if (fault == Fault::kCopyAfterABarrierBeforeTheWait) {
        emulated_syncthreads();  // every thread has issued its share
        if (t == 0) copy_over(1);
      }
      wgmma_wait_group<0>();
      if (fault == Fault::kCopyAfterTheWait) {
        if (barrier) {
          emulated_syncthreads();
        } else {
          emulated_syncwarp();
        }
        if (t == 31) copy_over(0);
      }
      for (int j = 0; j < kWgmmaN / kMmaN; ++j) {
        for (int i = 0; i < kMmaCElements; ++i) {
          d_seen[kMmaM * warp + mma_c_row(lane, i)][kMmaN * j + mma_c_col(lane, i)] = d[j][i];
        }
      }
    };
  };
  const auto launch = [&](Fault fault, bool barrier) {
    emulated_kernel_launch(kernel(fault, barrier), nullptr, 1, 128, 2 * kTileBytes);
  };
  launch(Fault::kNone, false);
  ASSERT_EQ(emulated_take_launch_error(true), 0);
  for (int m = 0; m < kRows; ++m) {
    for (int n = 0; n < kRows; ++n) {
      float sum = 0.0f;
      for (int k = 0; k < kCols; ++k) sum += a[m][k] * b[n][k];
      ASSERT_EQ(d_seen[m][n], sum) << "D(" << m << ", " << n << ")";
    }
  }
  expect_logic_error([&] { launch(Fault::kNoProxyFence, false); },
                     {"wgmma.m64n64k16 (A, B in shared memory): lane",
                      "'s cp.async wrote with no fence.proxy.async.shared::cta after it landed"});
  expect_logic_error([&] { launch(Fault::kNoWgmmaFence, false); },
                     {"wgmma.m64n64k16 (A, B in shared memory) with no wgmma.fence since the "
                      "thread began or last ran wgmma.wait_group"});
  for (Fault fault : {Fault::kCopyBeforeTheWait, Fault::kCopyAfterABarrierBeforeTheWait}) {
    expect_logic_error([&] { launch(fault, false); },
                       {"thread (0, 0, 0)", "cp.async of 16 bytes overwrites byte 2048",
                        "'s wgmma is still reading (no wgmma.wait_group of its group yet)"});
  }
  expect_logic_error(
      [&] { launch(Fault::kCopyAfterTheWait, false); },
      {"thread (31, 0, 0)", "cp.async of 16 bytes overwrites byte 0",
       "other threads read (ldmatrix, wgmma or a vector load) with no __syncthreads between"});
  expect_logic_error(
      [&] { launch(Fault::kWarp3Skips, false); },
      {"block (0, 0, 0): thread 96 issued 0 wgmma, another of its warpgroup 1", ".sync.aligned"});
  expect_logic_error([&] { launch(Fault::kWarp3ReadsAnotherB, false); },
                     {"number 1 of the thread differs from its warpgroup's", ".sync.aligned"});
  launch(Fault::kCopyAfterTheWait, true);
  EXPECT_EQ(emulated_take_launch_error(true), 0);
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
