// Token embedding: the forward gathers table rows (one thread per element); the backward adds
// each position's gradient into its token's row without atomics, one thread per (distinct
// token, column) walking that token's positions in increasing order (the batch's
// EmbeddingIndex, src/backend/embedding_index.h). CPU twin: gnmr::cpu::embedding_forward /
// embedding_backward (src/backend/cpu/embedding.cpp), which adds in the same position order:
// the results are bit-identical.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_forward_kernel(const int32_t* tokens, const float* table, float* out,
                                         int64_t n, int64_t d) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * d; e += stride) {
    out[e] = table[int64_t{tokens[e / d]} * d + e % d];
  }
}

__global__ void embedding_backward_kernel(const int32_t* unique_tokens, const int32_t* offsets,
                                          const int32_t* positions, int64_t n_unique,
                                          const float* dout, float* dtable, int64_t d) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n_unique * d; e += stride) {
    const int64_t u = e / d, j = e % d;
    float* cell = dtable + int64_t{unique_tokens[u]} * d + j;
    float sum = *cell;
    for (int32_t p = offsets[u]; p < offsets[u + 1]; ++p)
      sum += dout[int64_t{positions[p]} * d + j];
    *cell = sum;
  }
}

int blocks_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 1 << 16));
}

}  // namespace

void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t n, int64_t d,
                       cudaStream_t stream) {
  if (n * d == 0) return;
  embedding_forward_kernel<<<blocks_for(n * d), kThreads, 0, stream>>>(tokens, table, out, n, d);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(const int32_t* unique_tokens, const int32_t* offsets,
                        const int32_t* positions, int64_t n_unique, const float* dout,
                        float* dtable, int64_t d, cudaStream_t stream) {
  if (n_unique * d == 0) return;
  embedding_backward_kernel<<<blocks_for(n_unique * d), kThreads, 0, stream>>>(
      unique_tokens, offsets, positions, n_unique, dout, dtable, d);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
