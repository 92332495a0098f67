// The trainer's reductions: the multi-tensor sum of squares (per-unit gradient norms for GNMR
// and the global clip norm), the global-norm clip factor with the step's finite flag, and the
// micro-batch mean loss accumulated across micro-steps. Nothing is read back: the results stay
// in device memory for AdamW and the step's one readback.
// CPU twins: gnmr::cpu::sum_squares / global_norm_clip (src/backend/cpu/norms.cpp) and
// gnmr::cpu::accumulate_mean_loss (src/backend/cpu/cross_entropy.cpp). All three are
// bit-identical to them:
// - sum_squares uses the CPU's chunks of kSumSquaresChunk elements; inside a chunk four lanes
//   each run one of the CPU's four double accumulators in its order (element 4k + lane), the
//   0-3 leftover elements go to accumulator 0, and the four combine as (a0 + a1) + (a2 + a3);
//   then each tensor's chunk partials are added in chunk order from 0. A block takes 8 chunks:
//   warp 0's 32 lanes are their 8 x 4 accumulators, summing one stage of each chunk from shared
//   memory while warps 1-3 load the next stage into the other buffer. (With a block per chunk,
//   4 of a warp's 32 lanes summing and the loads waited for, a 3,231-chunk batch took 0.94 ms
//   on an H200, ncu: the FP64 pipe runs a warp instruction at the same cost however few lanes
//   it has.) The stages are zero past a chunk's end: + 0 * 0 leaves a non-negative sum's bits
//   as they are. No atomics.
// - global_norm_clip runs global_norm_clip_values (backend/train_math.h) on one thread.
// - accumulate_mean_loss adds the losses in index order on one thread (staged through shared
//   memory): [N] adds, nothing next to the [N, V] pass that made them.
#include <algorithm>
#include <vector>

#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

constexpr int kChunkThreads = 128;           // warp 0 sums, warps 1-3 load
constexpr int kChunksPerBlock = 8;           // warp 0's lanes: 8 chunks x 4 accumulators
constexpr int kStageFloats = 512;            // of each chunk per stage; a multiple of 4
constexpr int kStageRow = kStageFloats + 4;  // chunk c's stage 4c banks along: lane (c, a)
                                             // reads bank 4c + a + 4j, 32 lanes 32 banks
constexpr int kBatchTensors = 64;

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

// Block b: chunks first_chunk[0] + 8 b + c, c = 0..7 (those past the batch do nothing);
// workspace[chunk] = the chunk's sum of squares.
__global__ void __launch_bounds__(kChunkThreads)
    sum_squares_chunks_kernel(SumSquaresBatch batch, double* workspace) {
  __shared__ float stage[2][kChunksPerBlock][kStageRow];
  __shared__ const float* chunk_x[kChunksPerBlock];  // the chunk's first element; null: none
  __shared__ int64_t chunk_len[kChunksPerBlock];
  __shared__ double accumulators[kChunksPerBlock][4];
  const int c_self = static_cast<int>(threadIdx.x);
  const int64_t batch_end = batch.first_chunk[batch.num];
  if (c_self < kChunksPerBlock) {
    const int64_t chunk = batch.first_chunk[0] + int64_t{blockIdx.x} * kChunksPerBlock + c_self;
    chunk_x[c_self] = nullptr;
    chunk_len[c_self] = 0;
    if (chunk < batch_end) {
      int t = 0;  // the tensor holding this chunk (tensors without chunks are skipped)
      while (batch.first_chunk[t + 1] <= chunk) ++t;
      const int64_t begin = (chunk - batch.first_chunk[t]) * kSumSquaresChunk;
      chunk_x[c_self] = batch.tensors[t] + begin;
      chunk_len[c_self] = min_int64(kSumSquaresChunk, batch.counts[t] - begin);
    }
  }
  __syncthreads();
  int64_t longest = 0;  // the stages: enough for the block's longest whole-quad part
  for (int c = 0; c < kChunksPerBlock; ++c) {
    const int64_t len4 = chunk_len[c] - chunk_len[c] % 4;
    longest = len4 > longest ? len4 : longest;
  }
  const int64_t stages = (longest + kStageFloats - 1) / kStageFloats;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  // Warps 1-3: stage s of every chunk into buffer s % 2; zero past the chunk's whole quads.
  auto load_stage = [&](int64_t s) {
    for (int e = static_cast<int>(threadIdx.x) - 32; e < kChunksPerBlock * kStageFloats;
         e += kChunkThreads - 32) {
      const int c = e / kStageFloats, k = e % kStageFloats;
      const int64_t at = s * kStageFloats + k, len4 = chunk_len[c] - chunk_len[c] % 4;
      stage[s % 2][c][k] = at < len4 ? chunk_x[c][at] : 0.0f;
    }
  };
  const int c = lane / 4, a = lane % 4;  // warp 0: chunk c's accumulator a
  double acc = 0.0;
  if (warp != 0 && stages > 0) load_stage(0);
  __syncthreads();
  for (int64_t s = 0; s < stages; ++s) {
    if (warp != 0) {
      if (s + 1 < stages) load_stage(s + 1);
    } else {
      const float* mine = stage[s % 2][c];
      for (int j = a; j < kStageFloats; j += 4) {
        const double value = mine[j];
        acc += value * value;
      }
    }
    __syncthreads();  // stage s is summed, stage s + 1 is loaded
  }
  if (warp == 0) accumulators[c][a] = acc;
  __syncthreads();
  if (c_self < kChunksPerBlock && chunk_x[c_self] != nullptr) {
    const float* x = chunk_x[c_self];
    const int64_t len = chunk_len[c_self];
    double acc0 = accumulators[c_self][0];
    for (int64_t i = len - len % 4; i < len; ++i) acc0 += static_cast<double>(x[i]) * x[i];
    workspace[batch.first_chunk[0] + int64_t{blockIdx.x} * kChunksPerBlock + c_self] =
        (acc0 + accumulators[c_self][1]) + (accumulators[c_self][2] + accumulators[c_self][3]);
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
      const int64_t blocks = (batch_chunks + kChunksPerBlock - 1) / kChunksPerBlock;
      sum_squares_chunks_kernel<<<static_cast<unsigned>(blocks), kChunkThreads, 0, stream>>>(
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
