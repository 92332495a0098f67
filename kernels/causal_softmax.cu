// Causal softmax over the rows of the attention scores, forward and backward: one thread block
// per row of a T x T matrix. CPU twin: causal_softmax and the dS loop in
// src/backend/cpu/attention.cpp. The arithmetic follows the CPU's: max over keys 0..i,
// e = exp(s - max), a sum in double, p = e * float(1 / sum); dS = scale * P * (dP - dot) with
// dot = sum_j P dP. Row sums use a fixed reduction tree (no atomics), so results are
// bit-deterministic; they differ from the CPU's sequential order only by rounding.
#include <algorithm>
#include <cmath>

#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kMaxThreads = 512;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // rows beyond this loop inside a block

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Every thread of the block calls it and gets the same bits: an xor butterfly in each warp (each
// step combines two equal-shaped partial results, and + and max commute exactly), then the same
// over the warps' results. blockDim.x is a multiple of 32. scratch: 32 values of shared memory.
template <typename V, typename Op>
__device__ V block_reduce(V value, Op op, V identity, V* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  }
  __syncthreads();  // a previous row's readers of scratch are done
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < int(blockDim.x / 32) ? scratch[lane] : identity;
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  }
  return value;
}

// Each thread touches the same elements j = threadIdx.x + k * blockDim.x in every pass, so the
// in-place passes need no barrier between them beyond the reductions'.
__global__ void causal_softmax_forward_kernel(float* scores, int64_t rows, int64_t t) {
  __shared__ float max_scratch[32];
  __shared__ double sum_scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % t;  // query position: keys 0..i are visible
    float* r = scores + row * t;
    float row_max = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) row_max = fmaxf(row_max, r[j]);
    row_max = block_reduce(row_max, MaxOp{}, -INFINITY, max_scratch);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
      const float e = expf(r[j] - row_max);
      r[j] = e;
      sum += e;
    }
    sum = block_reduce(sum, SumOp{}, 0.0, sum_scratch);
    const float inv_sum = static_cast<float>(1.0 / sum);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) r[j] = j <= i ? r[j] * inv_sum : 0.0f;
  }
}

__global__ void causal_softmax_backward_kernel(const float* probs, float* dscores, int64_t rows,
                                               int64_t t, float scale) {
  __shared__ double sum_scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % t;
    const float* p = probs + row * t;
    float* d = dscores + row * t;
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dot += p[j] * d[j];
    const float row_dot = static_cast<float>(block_reduce(dot, SumOp{}, 0.0, sum_scratch));
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
      d[j] = j <= i ? scale * p[j] * (d[j] - row_dot) : 0.0f;
    }
  }
}

// A function of t alone, so the reduction tree (and hence the bits) depends only on the shape.
int threads_for(int64_t t) {
  const int64_t warps = (t + 31) / 32;
  return static_cast<int>(std::min<int64_t>(warps * 32, kMaxThreads));
}

int blocks_for(int64_t rows) {
  return static_cast<int>(std::min(rows, kMaxBlocks));
}

}  // namespace

void causal_softmax_forward(float* scores, int64_t matrices, int64_t t, cudaStream_t stream) {
  const int64_t rows = matrices * t;
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<blocks_for(rows), threads_for(t), 0, stream>>>(scores, rows, t);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void causal_softmax_backward(const float* probs, float* dscores, int64_t matrices, int64_t t,
                             float scale, cudaStream_t stream) {
  const int64_t rows = matrices * t;
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<blocks_for(rows), threads_for(t), 0, stream>>>(probs, dscores,
                                                                                  rows, t, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
