// Rotary position embedding in place, forward and backward (the transposed rotation): one
// block per token, its threads over the token's (head, pair)s. CPU twin:
// gnmr::cpu::rope_forward / rope_backward (src/backend/cpu/rope.cpp); both call
// rope_rotate_pair (src/backend/rope_math.h) with the host-made cos / sin tables, so the
// results are bit-identical.
// The token is the block, its position taken once: a flat thread per pair took three 64-bit
// divisions per pair for (token, head, pair), each a call of dozens of instructions, and took
// 2.5x the time of its bytes on an H200 (ncu). The in-token split is 32-bit.
#include <string>

#include "backend/rope_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rope_kernel(float* x, const float* cos, const float* sin, int64_t t, int heads, int64_t hd,
                bool inverse) {
  const int64_t token = blockIdx.x;
  const int half = static_cast<int>(hd / 2);
  const int64_t pos = token % t;
  const float* token_cos = cos + pos * half;
  const float* token_sin = sin + pos * half;
  float* token_x = x + token * heads * hd;
  for (int p = static_cast<int>(threadIdx.x); p < heads * half; p += kThreads) {
    const int head = p / half, i = p - head * half;
    float* lo = token_x + head * hd;
    rope_rotate_pair(lo[i], lo[i + half], token_cos[i], token_sin[i], inverse);
  }
}

void rope(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
          int64_t hd, bool inverse, cudaStream_t stream) {
  const int64_t tokens = b * t;
  if (tokens == 0 || hd / 2 == 0 || heads == 0) return;
  GNMR_CHECK(tokens <= INT32_MAX && heads * (hd / 2) <= INT32_MAX,
             "rope: " + std::to_string(tokens) + " tokens of " + std::to_string(heads) + " x " +
                 std::to_string(hd) + " is more than one launch holds (2^31 - 1 tokens, pairs)");
  rope_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      x, cos, sin, t, static_cast<int>(heads), hd, inverse);
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
