// Residual add and in-place scale, one thread per element (grid-stride). CPU twin:
// gnmr::cpu::residual_forward / scale (src/backend/cpu/elementwise.cpp): one IEEE add or
// multiply per element, so the results are bit-identical.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 1 << 16));
}

__global__ void residual_kernel(const float* a, const float* b, float* out, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] = a[i] + b[i];
  }
}

__global__ void scale_kernel(float* x, float factor, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    x[i] *= factor;
  }
}

}  // namespace

void residual_forward(const float* a, const float* b, float* out, int64_t count,
                      cudaStream_t stream) {
  if (count == 0) return;
  residual_kernel<<<blocks_for(count), kThreads, 0, stream>>>(a, b, out, count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, float factor, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, factor, count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
