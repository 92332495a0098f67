// Rotary position embedding in place, forward and backward (the transposed rotation): one
// thread per (token, head, pair). CPU twin: gnmr::cpu::rope_forward / rope_backward
// (src/backend/cpu/rope.cpp); both call rope_rotate_pair (src/backend/rope_math.h) with the
// host-made cos / sin tables, so the results are bit-identical.
#include <algorithm>

#include "backend/rope_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"

namespace gnmr::cuda {
namespace {

__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t tokens, int64_t t,
                            int64_t heads, int64_t hd, bool inverse) {
  const int64_t half = hd / 2, pairs = tokens * heads * half;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < pairs; e += stride) {
    const int64_t i = e % half, head = e / half % heads, token = e / (half * heads);
    const int64_t pos = token % t;
    float* lo = x + (token * heads + head) * hd;
    rope_rotate_pair(lo[i], lo[i + half], cos[pos * half + i], sin[pos * half + i], inverse);
  }
}

void rope(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
          int64_t hd, bool inverse, cudaStream_t stream) {
  const int64_t pairs = b * t * heads * (hd / 2);
  if (pairs == 0) return;
  constexpr int kThreads = 256;
  const int blocks =
      static_cast<int>(std::min<int64_t>((pairs + kThreads - 1) / kThreads, 1 << 16));
  rope_kernel<<<blocks, kThreads, 0, stream>>>(x, cos, sin, b * t, t, heads, hd, inverse);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                  int64_t hd, cudaStream_t stream) {
  rope(x, cos, sin, b, t, heads, hd, false, stream);
}

void rope_backward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t,
                   int64_t heads, int64_t hd, cudaStream_t stream) {
  rope(dx, cos, sin, b, t, heads, hd, true, stream);
}

}  // namespace gnmr::cuda
