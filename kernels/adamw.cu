// AdamW update, one thread per four parameters where the arrays are aligned
// (kernels/quad_access.cuh), else per parameter (grid-stride), the clip factor and the step's
// finite flag read from device memory so a skipped step costs no readback. CPU twin:
// gnmr::cpu::adamw_update (src/backend/cpu/adamw.cpp); both take their coefficients from
// adamw_coefficients and call adamw_update_element (src/backend/train_math.h), so the results
// are bit-identical.
#include <algorithm>

#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

// clip: [2] f32, clip[0] the gradient scale, clip[1] == 0 for a skipped (non-finite) step.
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t count,
                             AdamWCoefficients c, const float* clip) {
  if (clip[1] == 0.0f) return;
  const float grad_scale = clip[0];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    float p = param[i], mi = m[i], vi = v[i];
    adamw_update_element(p, grad[i], mi, vi, grad_scale, c);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

// Four parameters a thread (kernels/quad_access.cuh): the same per-element update.
__global__ void adamw_x4_kernel(float4* param, const float4* grad, float4* m, float4* v,
                                int64_t quads, AdamWCoefficients c, const float* clip) {
  if (clip[1] == 0.0f) return;
  const float grad_scale = clip[0];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += stride) {
    float4 p = param[i], mi = m[i], vi = v[i];
    const float4 g = grad[i];
    adamw_update_element(p.x, g.x, mi.x, vi.x, grad_scale, c);
    adamw_update_element(p.y, g.y, mi.y, vi.y, grad_scale, c);
    adamw_update_element(p.z, g.z, mi.z, vi.z, grad_scale, c);
    adamw_update_element(p.w, g.w, mi.w, vi.w, grad_scale, c);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

int blocks_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 1 << 16));
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count,
                  const AdamWStep& s, const float* clip, cudaStream_t stream) {
  GNMR_CHECK(s.step >= 1, "adamw_update: step is 1-based");
  if (count == 0) return;
  const AdamWCoefficients c = adamw_coefficients(s);
  const int64_t wide = aligned_quad_elements(count, {param, grad, m, v});
  if (wide > 0) {
    adamw_x4_kernel<<<blocks_for(wide / 4), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(param), reinterpret_cast<const float4*>(grad),
        reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), wide / 4, c, clip);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  if (count == wide) return;
  adamw_kernel<<<blocks_for(count - wide), kThreads, 0, stream>>>(
      param + wide, grad + wide, m + wide, v + wide, count - wide, c, clip);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
