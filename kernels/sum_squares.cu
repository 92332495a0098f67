// The trainer's reductions: the multi-tensor sum of squares (per-unit gradient norms for GNMR
// and the global clip norm), the global-norm clip factor with the step's finite flag, and the
// micro-batch mean loss accumulated across micro-steps. Nothing is read back: the results stay
// in device memory for AdamW and the step's one readback.
// CPU twins: gnmr::cpu::sum_squares / global_norm_clip (src/backend/cpu/norms.cpp) and
// gnmr::cpu::accumulate_mean_loss (src/backend/cpu/cross_entropy.cpp). All three are
// bit-identical to them:
// - sum_squares uses the CPU's chunks of kSumSquaresChunk elements; inside a chunk four lanes
//   each run one of the CPU's four double accumulators in its order (element 4k + lane), the
//   0-3 leftover elements go to lane 0, and the lanes combine as (a0 + a1) + (a2 + a3); then
//   each tensor's chunk partials are added in chunk order from 0. No atomics.
//   A warp runs eight chunks, one lane per accumulator, so every lane of every warp sums. The
//   warp copies a 256-element slice of each of its chunks into shared memory with coalesced
//   16-byte loads (the next slice's loads in flight while the lanes sum this one), and each
//   lane reads its accumulator's elements of its chunk from there.
//   Why: the four add chains of a chunk are serial by the CPU's order, so a chunk can keep only
//   four lanes busy. This kernel's first form gave each chunk a block of 128 threads, of which
//   lanes 0-3 of warp 0 summed while the rest only staged: every double conversion, multiply
//   and add was a warp instruction with 4 of 32 lanes working, and the double pipe (sm_90: 16
//   conversions and 64 double operations a clock per multiprocessor) bounded it. "norms" took
//   3.7 ms a step in the 1B bench (run 10, H200), four times its 4.4 GB of reads at the DRAM's
//   bandwidth; with every lane summing, those instructions are an eighth as many.
// - global_norm_clip runs global_norm_clip_values (backend/train_math.h) on one thread.
// - accumulate_mean_loss adds the losses in index order on one thread (staged through shared
//   memory): [N] adds, nothing next to the [N, V] pass that made them.
#include <algorithm>
#include <vector>

#include "backend/launch_batch.h"
#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

// One warp a block: the blocks of a launch (a batch's few thousand chunks, eight a block)
// spread evenly over the multiprocessors, where blocks of four warps left some with one block
// and others with two.
constexpr int kChunkThreads = 32;
constexpr int kChunksPerWarp = 8;    // 32 lanes / the CPU's 4 accumulators
constexpr int kSliceElements = 256;  // a chunk's elements a warp stages at a time; a multiple of 4
constexpr int kSliceSteps = kSliceElements / 4;  // an accumulator's elements in a slice
// A chunk's slice in shared memory, 4 floats longer: lane (chunk c, accumulator k) reads float
// 4i + k of slice c at bank (4c + 4i + k) mod 32, all 32 lanes on different banks.
constexpr int kSliceStride = kSliceElements + 4;
constexpr int kBatchTensors = 64;
constexpr int kSquaresAhead = 8;
static_assert(kSumSquaresChunk % kSliceElements == 0, "a chunk is whole slices");
static_assert(kSliceSteps % kSquaresAhead == 0, "a full slice is whole groups of squares");

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

// Chunk `chunk` of the batch: its first element and length (0 past the batch's last chunk).
struct ChunkSpan {
  const float* begin = nullptr;
  int len = 0;  // at most kSumSquaresChunk
};

__device__ ChunkSpan chunk_span(const SumSquaresBatch& batch, int64_t chunk) {
  ChunkSpan span;
  if (chunk >= batch.first_chunk[batch.num]) return span;
  const int t = batch_member(batch.first_chunk, batch.num, chunk);  // the tensor holding it
  const int64_t offset = (chunk - batch.first_chunk[t]) * kSumSquaresChunk;
  span.begin = batch.tensors[t] + offset;
  span.len = static_cast<int>(min_int64(kSumSquaresChunk, batch.counts[t] - offset));
  return span;
}

// The elements of slice `slice` of the warp's chunks that this lane copies: kQuads, quads
// lane and lane + 32 of each chunk's slice (16-byte loads; every tensor 16-byte aligned), else
// elements lane + 32 m. Only elements below each chunk's len4 (a multiple of 4) are read.
template <bool kQuads>
struct SliceCopy {
  static constexpr int kPerChunk = kSliceElements / 32;  // floats a lane copies of a chunk
  float values[kChunksPerWarp][kPerChunk];

  __device__ void load(const ChunkSpan (&spans)[kChunksPerWarp], const int (&len4)[kChunksPerWarp],
                       int slice, int lane) {
    const int base = slice * kSliceElements;
#pragma unroll
    for (int c = 0; c < kChunksPerWarp; ++c) {
#pragma unroll
      for (int m = 0; m < kPerChunk / (kQuads ? 4 : 1); ++m) {
        const int at = base + (kQuads ? 4 * (lane + 32 * m) : lane + 32 * m);
        float* v = &values[c][kQuads ? 4 * m : m];
        if (kQuads) {
          const float4 q = at < len4[c] ? *reinterpret_cast<const float4*>(spans[c].begin + at)
                                        : float4{0, 0, 0, 0};
          v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        } else {
          v[0] = at < len4[c] ? spans[c].begin[at] : 0.0f;
        }
      }
    }
  }

  // tile[c * kSliceStride + e] = element e of chunk c's slice.
  __device__ void store(float* tile, int lane) const {
#pragma unroll
    for (int c = 0; c < kChunksPerWarp; ++c) {
#pragma unroll
      for (int m = 0; m < kPerChunk / (kQuads ? 4 : 1); ++m) {
        const float* v = &values[c][kQuads ? 4 * m : m];
        if (kQuads) {
          *reinterpret_cast<float4*>(tile + c * kSliceStride + 4 * (lane + 32 * m)) =
              float4{v[0], v[1], v[2], v[3]};
        } else {
          tile[c * kSliceStride + lane + 32 * m] = v[0];
        }
      }
    }
  }
};

// workspace[chunk] = the chunk's sum of squares. Block b (one warp) runs the batch's chunks
// first_chunk[0] + 8 b + c, c = 0..7; lane 4c + k runs accumulator k of chunk c. Every lane
// takes the same number of slices (the warp's longest chunk's), so the __syncwarp and the
// shuffles see the whole warp.
template <bool kQuads>
__global__ void __launch_bounds__(kChunkThreads)
    sum_squares_chunks_kernel(SumSquaresBatch batch, double* workspace) {
  __shared__ __align__(16) float tile[kChunksPerWarp * kSliceStride];
  const int lane = threadIdx.x;
  const int my_chunk = lane / 4, accumulator = lane % 4;
  const int64_t first = batch.first_chunk[0] + int64_t{blockIdx.x} * kChunksPerWarp;
  ChunkSpan spans[kChunksPerWarp];
  int len4[kChunksPerWarp];
  int slices = 0;
#pragma unroll
  for (int c = 0; c < kChunksPerWarp; ++c) {
    spans[c] = chunk_span(batch, first + c);
    len4[c] = spans[c].len - spans[c].len % 4;
    const int chunk_slices = (len4[c] + kSliceElements - 1) / kSliceElements;
    slices = chunk_slices > slices ? chunk_slices : slices;
  }
  const float* mine = tile + my_chunk * kSliceStride;
  // This lane's chunk again by its own index (picking it out of spans by a lane-dependent index
  // would put spans in local memory).
  const ChunkSpan my_span = chunk_span(batch, first + my_chunk);
  const int my_len4 = my_span.len - my_span.len % 4;

  double acc = 0.0;  // the chunk's accumulator `accumulator` of the CPU loop
  SliceCopy<kQuads> copy;
  if (slices > 0) copy.load(spans, len4, 0, lane);
  for (int slice = 0; slice < slices; ++slice) {
    copy.store(tile, lane);
    __syncwarp();
    if (slice + 1 < slices) copy.load(spans, len4, slice + 1, lane);  // in flight while we sum
    // This lane's elements of the slice: 4 i + accumulator for i < steps (the chunk's len4 ends
    // at a multiple of 4, so its four lanes take the same steps).
    const int left = my_len4 - slice * kSliceElements;
    const int steps = left <= 0 ? 0 : (left / 4 < kSliceSteps ? left / 4 : kSliceSteps);
    // Eight squares ahead of their adds, which stay in the CPU's order: only the adds depend on
    // one another, so only their latency is serial.
    int i = 0;
    for (; i + kSquaresAhead <= steps; i += kSquaresAhead) {
      double squares[kSquaresAhead];
#pragma unroll
      for (int m = 0; m < kSquaresAhead; ++m) {
        const double value = mine[4 * (i + m) + accumulator];
        squares[m] = value * value;
      }
#pragma unroll
      for (int m = 0; m < kSquaresAhead; ++m) acc += squares[m];
    }
    for (; i < steps; ++i) {
      const double value = mine[4 * i + accumulator];
      acc += value * value;
    }
    __syncwarp();  // the slice is read before the next store overwrites it
  }
  // The 0-3 elements past len4 go to accumulator 0, in order, then (a0 + a1) + (a2 + a3).
  if (accumulator == 0) {
    for (int e = my_len4; e < my_span.len; ++e) {
      acc += static_cast<double>(my_span.begin[e]) * my_span.begin[e];
    }
  }
  const double pair = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, 1);     // a0 + a1, a2 + a3
  const double total = pair + __shfl_xor_sync(0xFFFFFFFFu, pair, 2);  // (a0 + a1) + (a2 + a3)
  if (accumulator == 0 && first + my_chunk < batch.first_chunk[batch.num]) {
    workspace[first + my_chunk] = total;
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
      bool quads = true;
      for (int i = 0; i < batch.num; ++i) quads = quads && all_16_byte_aligned({batch.tensors[i]});
      const auto blocks =
          static_cast<unsigned>((batch_chunks + kChunksPerWarp - 1) / kChunksPerWarp);
      dispatch_quads(quads, [&](auto q) {
        constexpr bool kQuads = decltype(q)::value;
        sum_squares_chunks_kernel<kQuads><<<blocks, kChunkThreads, 0, stream>>>(batch, workspace);
      });
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
