// Residual add and in-place scale, one thread per element (grid-stride). CPU twin:
// gnmr::cpu::residual_forward / scale (src/backend/cpu/elementwise.cpp): one IEEE add or
// multiply per element, so the results are bit-identical.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"
#include "kernels/quad_access.cuh"

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

// Four elements a thread (kernels/quad_access.cuh). Same adds, same bits.
__global__ void residual_x4_kernel(const float4* a, const float4* b, float4* out, int64_t quads) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    const float4 u = a[i], v = b[i];
    out[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
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
  // out may be a or b: each element is read before it is written, by the same thread.
  const int64_t quads = aligned_quad_elements(count, {a, b, out}) / 4;
  if (quads > 0) {
    residual_x4_kernel<<<blocks_for(quads), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
        reinterpret_cast<float4*>(out), quads);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t rest = count - 4 * quads;
  if (rest == 0) return;
  residual_kernel<<<blocks_for(rest), kThreads, 0, stream>>>(a + 4 * quads, b + 4 * quads,
                                                             out + 4 * quads, rest);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, float factor, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, factor, count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
