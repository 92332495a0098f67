// RMSNorm forward and backward (Hugging Face LlamaRMSNorm: y = w * x / sqrt(mean(x^2) + eps)).
// CPU twin: gnmr::cpu::rmsnorm_forward / rmsnorm_backward (src/backend/cpu/rmsnorm.cpp).
// Row statistics (sum of x^2, sum of dy w xhat) are summed in double by one block per row in a
// fixed tree (block_sum), the CPU in index order: they can differ in the last bits of a double,
// which after rounding to f32 is at most an ulp of the mean. Everything else is the CPU's
// per-element expression. dw is summed as on the CPU: per chunk of kRmsnormChunkRows rows in
// row order into the workspace, then the chunks in order, so given the same rstd it is
// bit-identical, and deterministic always.
#include <algorithm>

#include "backend/train_math.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kRowThreads = 256;      // one block per row
constexpr int kElementThreads = 256;  // one thread per (chunk, column)
constexpr int kCombineThreads = 64;   // one thread per column
constexpr int64_t kMaxBlocks = 1 << 20;

int blocks_for(int64_t items, int threads) {
  return static_cast<int>(std::min<int64_t>((items + threads - 1) / threads, kMaxBlocks));
}

// x, out: [n, d]; w: [d]; rstd: [n]. The row loop is uniform across the block (block_sum).
__global__ void rmsnorm_forward_kernel(const float* x, const float* w, float eps, float* out,
                                       float* rstd, int64_t n, int64_t d) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* xr = x + row * d;
    float* yr = out + row * d;
    double sum_sq = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      sum_sq += static_cast<double>(xr[j]) * xr[j];
    }
    sum_sq = block_sum(sum_sq);
    const float mean_sq = static_cast<float>(sum_sq / static_cast<double>(d));
    const float r = 1.0f / sqrtf(mean_sq + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yr[j] = w[j] * (xr[j] * r);
  }
}

// dx += r (g - xhat mean(g xhat)), g = dout w, xhat = x r; one block per row.
__global__ void rmsnorm_backward_dx_kernel(const float* x, const float* w, const float* rstd,
                                           const float* dout, float* dx, int64_t n, int64_t d) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* xr = x + row * d;
    const float* dyr = dout + row * d;
    float* dxr = dx + row * d;
    const float r = rstd[row];
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      dot += static_cast<double>(dyr[j] * w[j]) * (xr[j] * r);
    }
    dot = block_sum(dot);
    const float mean_dot = static_cast<float>(dot / static_cast<double>(d));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float xhat = xr[j] * r;
      dxr[j] += r * (dyr[j] * w[j] - xhat * mean_dot);
    }
  }
}

// workspace[chunk, j] = sum over the chunk's rows, in row order, of dout xhat; one thread per
// (chunk, j), j fastest so a warp reads a row segment.
__global__ void rmsnorm_backward_dw_partial_kernel(const float* x, const float* rstd,
                                                   const float* dout, int64_t n, int64_t d,
                                                   float* workspace) {
  const int64_t chunks = (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows;
  const int64_t items = chunks * d;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items; e += stride) {
    const int64_t chunk = e / d, j = e % d;
    const int64_t row_end =
        (chunk + 1) * kRmsnormChunkRows < n ? (chunk + 1) * kRmsnormChunkRows : n;
    float partial = 0.0f;
    for (int64_t row = chunk * kRmsnormChunkRows; row < row_end; ++row) {
      const float xhat = x[row * d + j] * rstd[row];
      partial += dout[row * d + j] * xhat;
    }
    workspace[e] = partial;
  }
}

// dw[j] += the chunks' partials, added in chunk order from 0. A thread's loads do not depend
// on its sum: unrolled, 16 are in flight at once, where one at a time made a 2048-column combine
// of 256 chunks take ~30 us on an H200 (ncu); small blocks spread the few columns over more
// multiprocessors.
__global__ void rmsnorm_backward_dw_combine_kernel(const float* workspace, int64_t chunks,
                                                   int64_t d, float* dw) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < d; j += stride) {
    float sum = 0.0f;
#pragma unroll 16
    for (int64_t chunk = 0; chunk < chunks; ++chunk) sum += workspace[chunk * d + j];
    dw[j] += sum;
  }
}

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float eps, float* out, float* rstd, int64_t n,
                     int64_t d, cudaStream_t stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(n, kMaxBlocks));
  rmsnorm_forward_kernel<<<blocks, kRowThreads, 0, stream>>>(x, w, eps, out, rstd, n, d);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

int64_t rmsnorm_backward_workspace_floats(int64_t n, int64_t d) {
  return (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows * d;
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dout,
                      float* dx, float* dw, int64_t n, int64_t d, float* workspace,
                      cudaStream_t stream) {
  if (n == 0 || d == 0) return;
  const int row_blocks = static_cast<int>(std::min<int64_t>(n, kMaxBlocks));
  rmsnorm_backward_dx_kernel<<<row_blocks, kRowThreads, 0, stream>>>(x, w, rstd, dout, dx, n, d);
  GNMR_CUDA_CHECK(cudaGetLastError());
  const int64_t chunks = (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows;
  rmsnorm_backward_dw_partial_kernel<<<blocks_for(chunks * d, kElementThreads), kElementThreads, 0,
                                       stream>>>(x, rstd, dout, n, d, workspace);
  GNMR_CUDA_CHECK(cudaGetLastError());
  rmsnorm_backward_dw_combine_kernel<<<blocks_for(d, kCombineThreads), kCombineThreads, 0,
                                       stream>>>(workspace, chunks, d, dw);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
