// Runs CUDA device code on the host, for the tests that check a kernel's indexing, tiling,
// masking and synchronisation without a GPU (test_flash_attention_emulated.cpp, for both flash
// kernels). The kernel's device code is extracted from its .cu
// file by extract_device_code.sh, which routes `extern __shared__` memory and __syncthreads()
// here; this header provides what it then reads:
// - threadIdx / blockIdx / blockDim: one std::thread per CUDA thread, blocks one after another;
// - shared memory, filled with NaN before each block, so a read of an unwritten element shows;
// - __syncthreads as a barrier of the block's threads;
// - per warp: mma_bf16_m16n8k16 (the tensor-core product, fragments as
//   src/backend/mma_fragment.h lays them out) and warp_shfl_xor, each an exchange through a
//   buffer between two barriers of the warp's 32 threads, as the hardware's lanes exchange
//   registers.
// The emulated mma sums each output's 16 exact bf16 products and its accumulator in double and
// rounds once to float; the hardware's summation order and internal precision differ, so GPU
// results match these within the fp32 rounding of a 16-term sum, not bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/mma_fragment.h"
#include "precision/bf16.h"

namespace gnmr::cuda {

struct EmulatedIndex {
  unsigned x = 0;
};

// A reusable barrier for a fixed number of threads (C++17 has no std::barrier).
class BlockBarrier {
 public:
  explicit BlockBarrier(int threads) : threads_(threads) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++waiting_ == threads_) {
      waiting_ = 0;
      ++generation_;
      all_arrived_.notify_all();
    } else {
      all_arrived_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int threads_, waiting_ = 0;
  uint64_t generation_ = 0;
};

// What the lanes of one warp hand each other in an emulated mma or shuffle.
struct WarpExchange {
  uint32_t a[kWarpSize][4];
  uint32_t b[kWarpSize][2];
  float c[kWarpSize][4];
  float value[kWarpSize];
};

inline thread_local EmulatedIndex threadIdx;
inline EmulatedIndex blockIdx, blockDim;
inline std::vector<float> shared_memory;
inline BlockBarrier* block_barrier = nullptr;
inline std::vector<std::unique_ptr<BlockBarrier>> warp_barriers;
inline std::vector<WarpExchange> warp_exchanges;

inline float* emulated_shared_memory() {
  return shared_memory.data();
}
inline void emulated_syncthreads() {
  block_barrier->arrive_and_wait();
}
inline void emulated_syncwarp() {
  warp_barriers[threadIdx.x / kWarpSize]->arrive_and_wait();
}

inline float warp_shfl_xor(float value, int lane_mask) {
  const int lane = int(threadIdx.x) % kWarpSize;
  WarpExchange& x = warp_exchanges[threadIdx.x / kWarpSize];
  x.value[lane] = value;
  emulated_syncwarp();
  const float other = x.value[lane ^ lane_mask];
  emulated_syncwarp();  // nobody overwrites x.value before every lane has read it
  return other;
}

inline void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  const int lane = int(threadIdx.x) % kWarpSize;
  WarpExchange& x = warp_exchanges[threadIdx.x / kWarpSize];
  std::copy(a, a + 4, x.a[lane]);
  std::copy(b, b + 2, x.b[lane]);
  std::copy(d, d + 4, x.c[lane]);
  emulated_syncwarp();
  const auto element = [](uint32_t pair, int i) {
    return decode_bf16(i % 2 == 0 ? bf16_pair_low(pair) : bf16_pair_high(pair));
  };
  float A[kMmaM][kMmaK], B[kMmaK][kMmaN];
  for (int l = 0; l < kWarpSize; ++l) {
    for (int i = 0; i < kMmaAElements; ++i) {
      A[mma_a_row(l, i)][mma_a_col(l, i)] = element(x.a[l][i / 2], i);
    }
    for (int i = 0; i < kMmaBElements; ++i) {
      B[mma_b_row(l, i)][mma_b_col(l, i)] = element(x.b[l][i / 2], i);
    }
  }
  for (int i = 0; i < kMmaCElements; ++i) {
    const int row = mma_c_row(lane, i), col = mma_c_col(lane, i);
    double sum = x.c[lane][i];
    for (int kk = 0; kk < kMmaK; ++kk) sum += double(A[row][kk]) * double(B[kk][col]);
    d[i] = float(sum);
  }
  emulated_syncwarp();  // nobody overwrites the exchange before every lane has read it
}

// Runs `kernel` as a grid of `blocks` blocks of `threads` threads (a multiple of the warp size)
// with `shared_floats` floats of shared memory.
inline void emulated_launch(int64_t blocks, int threads, int64_t shared_floats,
                            const std::function<void()>& kernel) {
  if (threads <= 0 || threads % kWarpSize != 0) {
    throw std::invalid_argument("emulated_launch: " + std::to_string(threads) +
                                " threads per block, not a positive multiple of 32");
  }
  blockDim.x = unsigned(threads);
  const int warps = threads / kWarpSize;
  warp_exchanges.assign(size_t(warps), WarpExchange{});
  for (int64_t b = 0; b < blocks; ++b) {
    blockIdx.x = unsigned(b);
    shared_memory.assign(size_t(std::max<int64_t>(shared_floats, 1)), std::nanf(""));
    BlockBarrier barrier(threads);
    block_barrier = &barrier;
    warp_barriers.clear();
    for (int w = 0; w < warps; ++w) {
      warp_barriers.push_back(std::make_unique<BlockBarrier>(kWarpSize));
    }
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&kernel, t] {
        threadIdx.x = unsigned(t);
        kernel();
      });
    }
    for (std::thread& worker : workers) worker.join();
  }
}

}  // namespace gnmr::cuda
