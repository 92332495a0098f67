// Softmax cross-entropy over the vocabulary, one block per row: one pass over the row in
// blockDim-wide chunks keeps each thread's online max and sum (Milakov & Gimelshein, "Online
// normalizer calculation for softmax", arXiv:1805.02867), the block combines them in a fixed
// tree; forward_backward then writes dloss * (softmax - onehot) over the logits in a second
// pass (no second [n, vocab] buffer). Targets < 0: loss 0 and a zero gradient row.
// CPU twin: gnmr::cpu::cross_entropy_forward / cross_entropy_forward_backward
// (src/backend/cpu/cross_entropy.cpp). Both use exp_vectorizable (backend/train_math.h) and the
// same max (exact), but the CPU sums exp(x - max) in lanes, this kernel online with rescaling:
// the sums, and so the losses and the gradient's scale, agree to a few f32 ulp, not bit for bit.
// Deterministic: a fixed blockDim fixes every order.
#include <algorithm>
#include <cmath>

#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "precision/bf16.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kMaxBlocks = 1 << 20;

// sum = sum of exp(x - max) over the elements seen; max = -inf with sum 0 for none. A NaN
// logit never becomes the max (v > max is false) but makes the sum NaN.
struct MaxSum {
  float max;
  float sum;
};

// Symmetric in a and b (fmaxf and + commute), so both lanes of a shuffle pair get the same bits.
// A side that saw no finite logit has sum 0, or NaN if it saw a NaN: added, not dropped.
__device__ MaxSum combine(MaxSum a, MaxSum b) {
  if (b.max == -INFINITY) return MaxSum{a.max, a.sum + b.sum};
  if (a.max == -INFINITY) return MaxSum{b.max, b.sum + a.sum};
  const float m = fmaxf(a.max, b.max);
  return MaxSum{m, a.sum * exp_vectorizable(a.max - m) + b.sum * exp_vectorizable(b.max - m)};
}

__device__ MaxSum warp_combine(MaxSum value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xFFFFFFFFu, value.max, offset),
                       __shfl_xor_sync(0xFFFFFFFFu, value.sum, offset)};
    value = combine(value, other);
  }
  return value;
}

// Every thread of the block calls it and gets the block's result.
__device__ MaxSum block_combine(MaxSum value) {
  __shared__ MaxSum warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_combine(value);
  __syncthreads();  // warp_results may still be read by a previous call
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? warp_results[lane] : MaxSum{-INFINITY, 0.0f};
  return warp_combine(value);
}

// The row's max and sum of exp(x - max), every thread of the block getting them.
__device__ MaxSum row_max_sum(const float* row, int64_t vocab) {
  MaxSum own{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = row[j];
    if (v > own.max) {
      own.sum = own.sum * exp_vectorizable(own.max - v) + 1.0f;  // 0 * e^-87 for the first
      own.max = v;
    } else if (own.max != -INFINITY || v != v) {
      // -inf logits before any finite one add nothing; a NaN makes the sum, and so the loss,
      // NaN, as on the CPU.
      own.sum += exp_vectorizable(v - own.max);
    }
  }
  return block_combine(own);
}

// losses[i] = log(sum) + (max - logits[i, target]), as the CPU forms it (log in double).
__device__ float row_loss(MaxSum stats, float target_logit) {
  return static_cast<float>(log(static_cast<double>(stats.sum)) +
                            static_cast<double>(stats.max - target_logit));
}

__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets,
                                             float* losses, int64_t n, int64_t vocab) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t target = targets[i];
    if (target < 0) {
      if (threadIdx.x == 0) losses[i] = 0.0f;
      continue;
    }
    const float* row = logits + i * vocab;
    const MaxSum stats = row_max_sum(row, vocab);
    if (threadIdx.x == 0) losses[i] = row_loss(stats, row[target]);
  }
}

// logits[i] <- dloss * (softmax(logits[i]) - onehot(target)): exp(x - max) * float(dloss / sum),
// then dloss subtracted at the target, the CPU's expression. grad_bf16 (or null): the gradient
// is written there instead, rounded to bf16 (encode_bf16), the bf16 GEMM operand of the lm_head's
// backward; logits is then only read.
__global__ void cross_entropy_forward_backward_kernel(float* logits, const int32_t* targets,
                                                      float* losses, float dloss, int64_t n,
                                                      int64_t vocab, uint16_t* grad_bf16) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t target = targets[i];
    float* row = logits + i * vocab;
    uint16_t* row_bf16 = grad_bf16 != nullptr ? grad_bf16 + i * vocab : nullptr;
    if (target < 0) {
      if (threadIdx.x == 0) losses[i] = 0.0f;
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        if (row_bf16 != nullptr) {
          row_bf16[j] = 0;  // encode_bf16(0.0f)
        } else {
          row[j] = 0.0f;
        }
      }
      continue;
    }
    // Read before the block's __syncthreads in row_max_sum, so before any thread overwrites it.
    const float target_logit = row[target];
    const MaxSum stats = row_max_sum(row, vocab);
    if (threadIdx.x == 0) losses[i] = row_loss(stats, target_logit);
    const float factor =
        static_cast<float>(static_cast<double>(dloss) / static_cast<double>(stats.sum));
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float e = exp_vectorizable(row[j] - stats.max) * factor;
      const float g = j == target ? e - dloss : e;
      if (row_bf16 != nullptr) {
        row_bf16[j] = encode_bf16(g);
      } else {
        row[j] = g;
      }
    }
    // The next row's reads do not touch this row, and row_max_sum syncs before it reuses
    // shared memory, so no barrier is needed here.
  }
}

int row_blocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>(n, kMaxBlocks));
}

}  // namespace

void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, int64_t n,
                           int64_t vocab, cudaStream_t stream) {
  if (n == 0) return;
  cross_entropy_forward_kernel<<<row_blocks(n), kThreads, 0, stream>>>(logits, targets, losses, n,
                                                                       vocab);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_forward_backward(float* logits, const int32_t* targets, float* losses,
                                    float dloss, int64_t n, int64_t vocab, cudaStream_t stream,
                                    uint16_t* grad_bf16) {
  if (n == 0) return;
  cross_entropy_forward_backward_kernel<<<row_blocks(n), kThreads, 0, stream>>>(
      logits, targets, losses, dloss, n, vocab, grad_bf16);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
