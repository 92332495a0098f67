// Rotary position embedding in place, forward and backward (the transposed rotation), and
// either rounded to bf16 into another array (the tensor-core flash attention's q and k; a bf16
// projection's dy): one block per token,
// its threads over the token's (head, pair)s. CPU twin:
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
#include "precision/bf16.h"

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

// RoPE (its backward when `inverse`) of x rounded to bf16 into out, x not written (the same
// pairs, the same rotation, then encode_bf16 of each result).
__global__ void __launch_bounds__(kThreads)
    rope_to_bf16_kernel(const float* x, const float* cos, const float* sin, int64_t t, int heads,
                        int64_t hd, bool inverse, uint16_t* out) {
  const int64_t token = blockIdx.x;
  const int half = static_cast<int>(hd / 2);
  const int64_t pos = token % t;
  const float* token_cos = cos + pos * half;
  const float* token_sin = sin + pos * half;
  const float* token_x = x + token * heads * hd;
  uint16_t* token_out = out + token * heads * hd;
  for (int p = static_cast<int>(threadIdx.x); p < heads * half; p += kThreads) {
    const int head = p / half, i = p - head * half;
    float lo = token_x[head * hd + i], hi = token_x[head * hd + i + half];
    rope_rotate_pair(lo, hi, token_cos[i], token_sin[i], inverse);
    token_out[head * hd + i] = encode_bf16(lo);
    token_out[head * hd + i + half] = encode_bf16(hi);
  }
}

// The launch's limits, checked on the host (a block per token, 32-bit pair indices).
bool rope_launchable(int64_t tokens, int64_t heads, int64_t hd) {
  if (tokens == 0 || hd / 2 == 0 || heads == 0) return false;
  GNMR_CHECK(tokens <= INT32_MAX && heads * (hd / 2) <= INT32_MAX,
             "rope: " + std::to_string(tokens) + " tokens of " + std::to_string(heads) + " x " +
                 std::to_string(hd) + " is more than one launch holds (2^31 - 1 tokens, pairs)");
  return true;
}

void rope(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
          int64_t hd, bool inverse, cudaStream_t stream) {
  const int64_t tokens = b * t;
  if (!rope_launchable(tokens, heads, hd)) return;
  rope_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      x, cos, sin, t, static_cast<int>(heads), hd, inverse);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void rope_to_bf16(const float* x, const float* cos, const float* sin, int64_t b, int64_t t,
                  int64_t heads, int64_t hd, bool inverse, uint16_t* out, cudaStream_t stream) {
  if (!rope_launchable(b * t, heads, hd)) return;
  rope_to_bf16_kernel<<<static_cast<unsigned>(b * t), kThreads, 0, stream>>>(
      x, cos, sin, t, static_cast<int>(heads), hd, inverse, out);
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

void rope_forward_to_bf16(const float* x, const float* cos, const float* sin, int64_t b, int64_t t,
                          int64_t heads, int64_t hd, uint16_t* out, cudaStream_t stream) {
  rope_to_bf16(x, cos, sin, b, t, heads, hd, false, out, stream);
}

void rope_backward_to_bf16(const float* dx, const float* cos, const float* sin, int64_t b,
                           int64_t t, int64_t heads, int64_t hd, uint16_t* out,
                           cudaStream_t stream) {
  rope_to_bf16(dx, cos, sin, b, t, heads, hd, true, out, stream);
}

}  // namespace gnmr::cuda
