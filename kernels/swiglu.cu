// SwiGLU forward and backward, one thread per four elements where the arrays are aligned
// (kernels/quad_access.cuh), else per element. CPU twin:
// gnmr::cpu::swiglu_forward / swiglu_backward (src/backend/cpu/swiglu.cpp); both call
// swiglu_forward_element / swiglu_backward_element (src/backend/train_math.h), so the results
// are bit-identical. And, for a bf16 projection beside it (the fused MLP ops), the forward's
// output written with its bf16 copy (down's x), and one of the backward's gradients rounded to
// bf16 and nothing else (gate's or up's dy): encode_bf16 (precision/bf16.h) of the same value,
// as convert_to_bf16 would round it.
#include <algorithm>

#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/train_ops.cuh"
#include "precision/bf16.h"

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

__global__ void swiglu_forward_x4_kernel(const float4* gate, const float4* up, float4* out,
                                         int64_t quads) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    const float4 g = gate[i], u = up[i];
    out[i] = make_float4(swiglu_forward_element(g.x, u.x), swiglu_forward_element(g.y, u.y),
                         swiglu_forward_element(g.z, u.z), swiglu_forward_element(g.w, u.w));
  }
}

__global__ void swiglu_backward_x4_kernel(const float4* gate, const float4* up, const float4* dout,
                                          float4* dgate, float4* dup, int64_t quads) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    const float4 g = gate[i], u = up[i], d = dout[i];
    float4 dg, du;
    swiglu_backward_element(g.x, u.x, d.x, dg.x, du.x);
    swiglu_backward_element(g.y, u.y, d.y, dg.y, du.y);
    swiglu_backward_element(g.z, u.z, d.z, dg.z, du.z);
    swiglu_backward_element(g.w, u.w, d.w, dg.w, du.w);
    dgate[i] = dg;
    dup[i] = du;
  }
}

// The forward's output written and rounded to bf16 (a bf16 projection's x), four a thread.
__global__ void swiglu_forward_with_bf16_x4_kernel(const float4* gate, const float4* up,
                                                   float4* out, uint2* out_bf16, int64_t quads) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    const float4 g = gate[i], u = up[i];
    const float4 h =
        make_float4(swiglu_forward_element(g.x, u.x), swiglu_forward_element(g.y, u.y),
                    swiglu_forward_element(g.z, u.z), swiglu_forward_element(g.w, u.w));
    out[i] = h;
    out_bf16[i] = make_uint2(uint32_t{encode_bf16(h.x)} | uint32_t{encode_bf16(h.y)} << 16,
                             uint32_t{encode_bf16(h.z)} | uint32_t{encode_bf16(h.w)} << 16);
  }
}

__global__ void swiglu_forward_with_bf16_kernel(const float* gate, const float* up, float* out,
                                                uint16_t* out_bf16, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    const float h = swiglu_forward_element(gate[i], up[i]);
    out[i] = h;
    out_bf16[i] = encode_bf16(h);
  }
}

// dgate, or dup where up_gradient, of element i.
__device__ inline float swiglu_gradient(float gate, float up, float dout, bool up_gradient) {
  float dgate, dup;
  swiglu_backward_element(gate, up, dout, dgate, dup);
  return up_gradient ? dup : dgate;
}

__global__ void swiglu_gradient_to_bf16_kernel(const float* gate, const float* up,
                                               const float* dout, bool up_gradient, uint16_t* out,
                                               int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] =
        encode_bf16(swiglu_gradient(gate[i], up_gradient ? 0.0f : up[i], dout[i], up_gradient));
  }
}

// Four elements a thread, the four bf16 codes one 8-byte store (little-endian, as
// convert_to_bf16_x4 packs them). dup reads no up.
__global__ void swiglu_gradient_to_bf16_x4_kernel(const float4* gate, const float4* up,
                                                  const float4* dout, bool up_gradient, uint2* out,
                                                  int64_t quads) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    const float4 g = gate[i], d = dout[i], u = up_gradient ? float4{0, 0, 0, 0} : up[i];
    const uint32_t x = encode_bf16(swiglu_gradient(g.x, u.x, d.x, up_gradient));
    const uint32_t y = encode_bf16(swiglu_gradient(g.y, u.y, d.y, up_gradient));
    const uint32_t z = encode_bf16(swiglu_gradient(g.z, u.z, d.z, up_gradient));
    const uint32_t w = encode_bf16(swiglu_gradient(g.w, u.w, d.w, up_gradient));
    out[i] = make_uint2(x | y << 16, z | w << 16);
  }
}

}  // namespace

void swiglu_forward_with_bf16(const float* gate, const float* up, float* out, uint16_t* out_bf16,
                              int64_t count, cudaStream_t stream) {
  const bool aligned =
      all_16_byte_aligned({gate, up, out}) && reinterpret_cast<uintptr_t>(out_bf16) % 8 == 0;
  const int64_t wide = aligned ? count - count % 4 : 0;
  if (wide > 0) {
    swiglu_forward_with_bf16_x4_kernel<<<blocks_for(wide / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up),
        reinterpret_cast<float4*>(out), reinterpret_cast<uint2*>(out_bf16), wide / 4);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  if (count == wide) return;
  swiglu_forward_with_bf16_kernel<<<blocks_for(count - wide), kThreads, 0, stream>>>(
      gate + wide, up + wide, out + wide, out_bf16 + wide, count - wide);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void swiglu_gradient_to_bf16(const float* gate, const float* up, const float* dout,
                             bool up_gradient, uint16_t* out, int64_t count, cudaStream_t stream) {
  const bool aligned = all_16_byte_aligned({gate, dout, up_gradient ? gate : up}) &&
                       reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t wide = aligned ? count - count % 4 : 0;
  if (wide > 0) {
    swiglu_gradient_to_bf16_x4_kernel<<<blocks_for(wide / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up),
        reinterpret_cast<const float4*>(dout), up_gradient, reinterpret_cast<uint2*>(out),
        wide / 4);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  if (count == wide) return;
  swiglu_gradient_to_bf16_kernel<<<blocks_for(count - wide), kThreads, 0, stream>>>(
      gate + wide, up_gradient ? up : up + wide, dout + wide, up_gradient, out + wide,
      count - wide);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void swiglu_forward(const float* gate, const float* up, float* out, int64_t count,
                    cudaStream_t stream) {
  const int64_t wide = aligned_quad_elements(count, {gate, up, out});
  if (wide > 0) {
    swiglu_forward_x4_kernel<<<blocks_for(wide / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up),
        reinterpret_cast<float4*>(out), wide / 4);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  if (count == wide) return;
  swiglu_forward_kernel<<<blocks_for(count - wide), kThreads, 0, stream>>>(
      gate + wide, up + wide, out + wide, count - wide);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t count, cudaStream_t stream) {
  const int64_t wide = aligned_quad_elements(count, {gate, up, dout, dgate, dup});
  if (wide > 0) {
    swiglu_backward_x4_kernel<<<blocks_for(wide / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up),
        reinterpret_cast<const float4*>(dout), reinterpret_cast<float4*>(dgate),
        reinterpret_cast<float4*>(dup), wide / 4);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  if (count == wide) return;
  swiglu_backward_kernel<<<blocks_for(count - wide), kThreads, 0, stream>>>(
      gate + wide, up + wide, dout + wide, dgate + wide, dup + wide, count - wide);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
