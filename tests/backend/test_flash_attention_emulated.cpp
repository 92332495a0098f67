// The flash-attention kernels' device code (kernels/flash_attention.cu, between its "device code"
// markers, rewritten by extract_device_code.sh) run on the host: every block in turn, one
// std::thread per CUDA thread, a barrier for __syncthreads and shared memory filled with NaN
// before each block. With the host's expf / logf that code follows the CPU twin
// (cpu/flash_attention.cpp) in the order of every operation, so out, lse, dq, dk and dv must
// equal the twin's bit for bit: an indexing, tiling, masking or barrier error shows up here,
// without a GPU. What only a GPU can check (launch configuration, real concurrency within a
// warp, CUDA's own expf) is tests/gpu/test_gpu_flash_attention.cpp's job.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/flash_attention.h"
#include "backend/flash_layout.h"

namespace gnmr::cuda {
namespace {

struct EmulatedIndex {
  unsigned x = 0;
};

// A reusable barrier for the threads of one emulated block (C++17 has no std::barrier).
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

thread_local EmulatedIndex threadIdx;
EmulatedIndex blockIdx;
const EmulatedIndex blockDim{unsigned(kFlashThreads)};
std::vector<float> shared_memory;
BlockBarrier* block_barrier = nullptr;

float* emulated_shared_memory() {
  return shared_memory.data();
}
void emulated_syncthreads() {
  block_barrier->arrive_and_wait();
}

#include "flash_attention_device_code.inc"

// Runs `kernel` as a grid of `blocks` blocks of kFlashThreads threads.
void launch(int64_t blocks, int64_t shared_floats, const std::function<void()>& kernel) {
  for (int64_t b = 0; b < blocks; ++b) {
    blockIdx.x = unsigned(b);
    shared_memory.assign(size_t(std::max<int64_t>(shared_floats, 1)), std::nanf(""));
    BlockBarrier barrier(kFlashThreads);
    block_barrier = &barrier;
    std::vector<std::thread> threads;
    for (int t = 0; t < kFlashThreads; ++t) {
      threads.emplace_back([&kernel, t] {
        threadIdx.x = unsigned(t);
        kernel();
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
}

std::vector<float> random_normal(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) * scale;
  return x;
}

size_t count_bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differ;
}

template <int HD>
void expect_kernels_equal_the_twin(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads) {
  const AttentionShape s{batch, seq, heads, kv_heads, HD};
  SCOPED_TRACE("B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
               " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
               " hd=" + std::to_string(HD));
  const size_t nq = size_t(batch * seq * heads * HD), nkv = size_t(batch * seq * kv_heads * HD);
  const size_t rows = size_t(batch * heads * seq);
  // q scaled by 2: scores spread enough for the running max to move across key tiles.
  const std::vector<float> q = random_normal(nq, 1, 2.0f), k = random_normal(nkv, 2, 1.0f),
                           v = random_normal(nkv, 3, 1.0f), dout = random_normal(nq, 4, 1.0f);
  const float nan = std::nanf("");
  std::vector<float> out(nq, nan), lse(rows, nan), delta(rows, nan), dq(nq, nan), dk(nkv, nan),
      dv(nkv, nan);
  const FlashTiling tiles = flash_gpu_tiling(seq);
  const Dims d{batch, seq, heads, kv_heads};
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const auto shared = [&](FlashKernel kernel) {
    return flash_shared_layout(kernel, HD, tiles).total_floats;
  };
  const auto blocks = [&](FlashKernel kernel) {
    return flash_grid_blocks(kernel, batch, heads, kv_heads, tiles);
  };
  launch(blocks(FlashKernel::Forward), shared(FlashKernel::Forward), [&] {
    flash_forward_kernel<HD>(q.data(), k.data(), v.data(), out.data(), lse.data(), d, tiles, scale);
  });
  launch((int64_t(rows) + kFlashThreads - 1) / kFlashThreads, 0,
         [&] { flash_delta_kernel<HD>(out.data(), dout.data(), delta.data(), d); });
  launch(blocks(FlashKernel::BackwardKeyValue), shared(FlashKernel::BackwardKeyValue), [&] {
    flash_backward_key_value_kernel<HD>(q.data(), k.data(), v.data(), lse.data(), delta.data(),
                                        dout.data(), dk.data(), dv.data(), d, tiles, scale);
  });
  launch(blocks(FlashKernel::BackwardQuery), shared(FlashKernel::BackwardQuery), [&] {
    flash_backward_query_kernel<HD>(q.data(), k.data(), v.data(), lse.data(), delta.data(),
                                    dout.data(), dq.data(), d, tiles, scale);
  });

  std::vector<float> twin_out(nq), twin_lse(rows), twin_dq(nq), twin_dk(nkv), twin_dv(nkv);
  cpu::flash_attention_forward(q.data(), k.data(), v.data(), twin_out.data(), twin_lse.data(), s,
                               tiles, 1);
  cpu::flash_attention_backward(q.data(), k.data(), v.data(), twin_out.data(), twin_lse.data(),
                                dout.data(), twin_dq.data(), twin_dk.data(), twin_dv.data(), s,
                                tiles, 1);
  EXPECT_EQ(count_bit_differences(out, twin_out), 0u) << "out";
  EXPECT_EQ(count_bit_differences(lse, twin_lse), 0u) << "lse";
  EXPECT_EQ(count_bit_differences(dq, twin_dq), 0u) << "dq";
  EXPECT_EQ(count_bit_differences(dk, twin_dk), 0u) << "dk";
  EXPECT_EQ(count_bit_differences(dv, twin_dv), 0u) << "dv";
}

TEST(FlashAttentionEmulated, KernelsEqualTheCpuTwinBitForBit) {
  expect_kernels_equal_the_twin<64>(2, 1, 4, 2);     // one key
  expect_kernels_equal_the_twin<64>(2, 17, 8, 2);    // one partial tile, GQA group of 4
  expect_kernels_equal_the_twin<64>(1, 130, 4, 4);   // two full tiles and a partial one
  expect_kernels_equal_the_twin<128>(1, 200, 4, 2);  // hd 128, partial last tile of 8
  expect_kernels_equal_the_twin<128>(1, 64, 2, 1);   // exactly one tile, all heads share kv
}

}  // namespace
}  // namespace gnmr::cuda
