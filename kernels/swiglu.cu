// SwiGLU forward and backward, one thread per element (grid-stride). CPU twin:
// gnmr::cpu::swiglu_forward / swiglu_backward (src/backend/cpu/swiglu.cpp); both call
// swiglu_forward_element / swiglu_backward_element (src/backend/train_math.h), so the results
// are bit-identical.
#include <algorithm>

#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 1 << 16));
}

__global__ void swiglu_forward_kernel(const float* gate, const float* up, float* out,
                                      int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] = swiglu_forward_element(gate[i], up[i]);
  }
}

__global__ void swiglu_backward_kernel(const float* gate, const float* up, const float* dout,
                                       float* dgate, float* dup, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    float dg, du;
    swiglu_backward_element(gate[i], up[i], dout[i], dg, du);
    dgate[i] = dg;
    dup[i] = du;
  }
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, float* out, int64_t count,
                    cudaStream_t stream) {
  if (count == 0) return;
  swiglu_forward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(gate, up, out, count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  swiglu_backward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(gate, up, dout, dgate, dup,
                                                                     count);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
