// The trainer's reductions: the multi-tensor sum of squares (per-unit gradient norms for GNMR
// and the global clip norm), the global-norm clip factor with the step's finite flag, and the
// micro-batch mean loss accumulated across micro-steps. Nothing is read back: the results stay
// in device memory for AdamW and the step's one readback.
// CPU twins: gnmr::cpu::sum_squares / global_norm_clip (src/backend/cpu/norms.cpp) and
// gnmr::cpu::accumulate_mean_loss (src/backend/cpu/cross_entropy.cpp). All three are
// bit-identical to them:
// - sum_squares uses the CPU's chunks of kSumSquaresChunk elements; inside a chunk four threads
//   each run one of the CPU's four double accumulators in its order (element 4k + lane), the
//   0-3 leftover elements go to lane 0, and the lanes combine as (a0 + a1) + (a2 + a3); then
//   each tensor's chunk partials are added in chunk order from 0. One block per chunk stages
//   the chunk through shared memory so the loads are coalesced; the four dependent add chains
//   (16384 adds each) bound a chunk's time, and the chunks run in parallel. No atomics.
//   Only the adds are serial: each lane computes eight squares ahead of them, and each thread
//   issues its sixteen staging loads before it stores any. With one element at a time through
//   both loops, a 3,231-chunk batch took 0.94 ms on an H200 (DRAM at 19% of its bandwidth,
//   ncu): every load, conversion and multiply sat in the chain. "norms" in the 1B bench went
//   from 5.8 to 3.7 ms a step (each a pass over 1.1 B gradients). Eight chunks a block, warp 0's
//   32 lanes summing from shared memory while warps 1-3 staged the next slice, was slower
//   still in the 1B bench (11.7 ms of "norms" per step against 6.4): with an eighth of the
//   blocks, too few loads were in flight.
// - global_norm_clip runs global_norm_clip_values (backend/train_math.h) on one thread.
// - accumulate_mean_loss adds the losses in index order on one thread (staged through shared
//   memory): [N] adds, nothing next to the [N, V] pass that made them.
#include <algorithm>
#include <vector>

#include "backend/launch_batch.h"
#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

constexpr int kChunkThreads = 128;
constexpr int kTile = 2048;  // floats staged per step; a multiple of 4 (the lane count)
constexpr int kBatchTensors = 64;
constexpr int kStagePerThread = kTile / kChunkThreads;  // 16 loads a thread per slice
constexpr int kSquaresAhead = 8;

// Up to kBatchTensors tensors, passed by value as a kernel parameter (~1.6 KB, under the 4 KB
// limit). first_chunk: workspace index of each tensor's first chunk; [num] is one past the last.
struct SumSquaresBatch {
  const float* tensors[kBatchTensors];
  int64_t counts[kBatchTensors];
  int64_t first_chunk[kBatchTensors + 1];
  int num;
};

__device__ int64_t min_int64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

int64_t chunks_of(int64_t count) {
  return (count + kSumSquaresChunk - 1) / kSumSquaresChunk;
}

// One block per chunk of the batch: workspace[chunk] = the chunk's sum of squares.
__global__ void sum_squares_chunks_kernel(SumSquaresBatch batch, double* workspace) {
  __shared__ float tile[kTile];
  __shared__ double lane_sums[4];
  const int64_t chunk = batch.first_chunk[0] + blockIdx.x;
  const int t = batch_member(batch.first_chunk, batch.num, chunk);  // the tensor holding it
  const float* x = batch.tensors[t];
  const int64_t begin = (chunk - batch.first_chunk[t]) * kSumSquaresChunk;
  const int64_t len = min_int64(kSumSquaresChunk, batch.counts[t] - begin);
  const int64_t len4 = len - len % 4;
  double acc = 0.0;  // threads 0..3: accumulator `lane = threadIdx.x` of the CPU loop
  for (int64_t t0 = 0; t0 < len4; t0 += kTile) {
    const int count = static_cast<int>(min_int64(kTile, len4 - t0));  // a multiple of 4
    const float* slice = x + begin + t0;
    // A thread's loads all in flight before the first store (one load at a time, each waiting
    // for the last, made the staging as slow as the sums).
    int k = threadIdx.x;
    for (; k + (kStagePerThread - 1) * kChunkThreads < count;
         k += kStagePerThread * kChunkThreads) {
      float staged[kStagePerThread];
      for (int m = 0; m < kStagePerThread; ++m) staged[m] = slice[k + m * kChunkThreads];
      for (int m = 0; m < kStagePerThread; ++m) tile[k + m * kChunkThreads] = staged[m];
    }
    for (; k < count; k += kChunkThreads) tile[k] = slice[k];
    __syncthreads();
    if (threadIdx.x < 4) {
      // Eight squares of the lane's elements ahead of their adds, which stay in the CPU's
      // order: only the adds depend on one another, so only their latency is serial (a square
      // at a time put the shared-memory load, the conversion and the multiply in the chain too).
      int e = threadIdx.x;
      for (; e + 4 * (kSquaresAhead - 1) < count; e += 4 * kSquaresAhead) {
        double squares[kSquaresAhead];
        for (int m = 0; m < kSquaresAhead; ++m) {
          const double value = tile[e + 4 * m];
          squares[m] = value * value;
        }
        for (int m = 0; m < kSquaresAhead; ++m) acc += squares[m];
      }
      for (; e < count; e += 4) {
        const double value = tile[e];
        acc += value * value;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x < 4) lane_sums[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double acc0 = lane_sums[0];
    for (int64_t i = begin + len4; i < begin + len; ++i) acc0 += static_cast<double>(x[i]) * x[i];
    workspace[chunk] = (acc0 + lane_sums[1]) + (lane_sums[2] + lane_sums[3]);
  }
}

// One thread per tensor of the batch: out = 0 + its chunks' partials in chunk order.
__global__ void sum_squares_combine_kernel(SumSquaresBatch batch, const double* workspace,
                                           double* out_per_tensor) {
  const int t = threadIdx.x;
  if (t >= batch.num) return;
  double sum = 0.0;
  for (int64_t c = batch.first_chunk[t]; c < batch.first_chunk[t + 1]; ++c) sum += workspace[c];
  out_per_tensor[t] = sum;
}

__global__ void global_norm_clip_kernel(const double* sum_squares, int64_t count,
                                        const double* loss_sum, double max_norm, float* clip) {
  global_norm_clip_values(sum_squares, count, loss_sum[0], max_norm, clip);
}

constexpr int kLossThreads = 256;
constexpr int kLossTile = 2048;

// One block: the block loads a tile, thread 0 adds it in index order.
__global__ void accumulate_mean_loss_kernel(const float* losses, int64_t n, int64_t valid,
                                            double* loss_sum) {
  __shared__ float tile[kLossTile];
  double sum = 0.0;  // thread 0's is the result
  for (int64_t base = 0; base < n; base += kLossTile) {
    const int count = static_cast<int>(min_int64(kLossTile, n - base));
    for (int k = threadIdx.x; k < count; k += blockDim.x) tile[k] = losses[base + k];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < count; ++k) sum += tile[k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss_sum += static_cast<double>(static_cast<float>(sum / static_cast<double>(valid)));
  }
}

}  // namespace

int64_t sum_squares_workspace_doubles(const int64_t* counts, int64_t num_tensors) {
  int64_t chunks = 0;
  for (int64_t t = 0; t < num_tensors; ++t) chunks += chunks_of(counts[t]);
  return chunks;
}

void sum_squares(const float* const* tensors, const int64_t* counts, int64_t num_tensors,
                 double* out_per_tensor, double* workspace, cudaStream_t stream) {
  int64_t next_chunk = 0;
  for (int64_t first = 0; first < num_tensors; first += kBatchTensors) {
    SumSquaresBatch batch{};
    batch.num = static_cast<int>(std::min<int64_t>(kBatchTensors, num_tensors - first));
    batch.first_chunk[0] = next_chunk;
    for (int i = 0; i < batch.num; ++i) {
      GNMR_CHECK(counts[first + i] >= 0, "sum_squares: negative element count");
      batch.tensors[i] = tensors[first + i];
      batch.counts[i] = counts[first + i];
      batch.first_chunk[i + 1] = batch.first_chunk[i] + chunks_of(counts[first + i]);
    }
    for (int i = batch.num; i < kBatchTensors; ++i) {
      batch.first_chunk[i + 1] = batch.first_chunk[batch.num];
    }
    const int64_t batch_chunks = batch.first_chunk[batch.num] - next_chunk;
    if (batch_chunks > 0) {
      GNMR_CHECK(batch_chunks <= int64_t{0x7FFFFFFF}, "sum_squares: too many chunks in one batch");
      sum_squares_chunks_kernel<<<static_cast<unsigned>(batch_chunks), kChunkThreads, 0, stream>>>(
          batch, workspace);
      GNMR_CUDA_CHECK(cudaGetLastError());
    }
    sum_squares_combine_kernel<<<1, kBatchTensors, 0, stream>>>(batch, workspace,
                                                                out_per_tensor + first);
    GNMR_CUDA_CHECK(cudaGetLastError());
    next_chunk = batch.first_chunk[batch.num];
  }
}

void global_norm_clip(const double* sum_squares, int64_t count, const double* loss_sum,
                      double max_norm, float* clip, cudaStream_t stream) {
  global_norm_clip_kernel<<<1, 1, 0, stream>>>(sum_squares, count, loss_sum, max_norm, clip);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void accumulate_mean_loss(const float* losses, int64_t n, int64_t valid, double* loss_sum,
                          cudaStream_t stream) {
  accumulate_mean_loss_kernel<<<1, kLossThreads, 0, stream>>>(losses, n, valid, loss_sum);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
