// Per-element math of the training ops, shared by the CPU twins (src/backend/cpu) and the CUDA
// kernels (kernels/train_ops.cuh) so both give the same bits: neither side contracts to FMA
// (-ffp-contract=off, nvcc --fmad=false), and / and sqrt round correctly on both (IEEE-754).
//   exp_vectorizable: the softmax / sigmoid exp (Cephes expf, below)
//   swiglu_*_element: SwiGLU forward and backward (cpu/swiglu.cpp, kernels/swiglu.cu)
//   adamw_update_element: one AdamW step of one parameter (cpu/adamw.cpp, kernels/adamw.cu)
//   global_norm_clip_values: clip factor, finite flag (cpu/norms.cpp, kernels/sum_squares.cu)
// and the chunk sizes that fix the reductions' order on both.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "backend/backend.h"
#include "precision/host_device.h"

namespace gnmr {

// Elements per partial sum of sum_squares; the result does not depend on the thread count.
constexpr int64_t kSumSquaresChunk = 1 << 16;
// Rows per partial-sum chunk of rmsnorm_backward's dw: workspace [ceil(n / 32), d].
constexpr int64_t kRmsnormChunkRows = 32;

// exp written so gcc vectorizes it (no calls, no branches): Cephes expf — range reduction
// x = n ln2 + r with ln2 split in two, a degree-5 minimax polynomial for e^r on |r| <= ln2 / 2,
// 2^n assembled in the exponent bits. Max error about 2 ulp over [-87, 88]; below -87 it
// returns e^-87 (the softmax and sigmoid uses only need the underflow to be monotone). A NaN
// comes out as NaN, so a NaN logit or score makes the loss NaN instead of vanishing into the
// clamp as e^88.
GNMR_HD_INLINE float exp_vectorizable(float arg) {
  float x = arg < 88.0f ? arg : 88.0f;
  x = x > -87.0f ? x : -87.0f;  // keeps 2^n a normal number
  // n = round(x / ln2), by the 1.5 * 2^23 trick (vectorizes without SSE4.1 round)
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln2 high part (exact in 9 bits)
  r = r - n * -2.12194440e-4f;     // ln2 low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof(two_n));
  return arg == arg ? er * two_n : arg;  // a select, so the loops still vectorize
}

// The double reference path (gradient-check tests) keeps libm.
GNMR_HD_INLINE double exp_vectorizable(double x) {
  return exp(x);
}

// SwiGLU (Hugging Face LlamaMLP): out = silu(gate) * up, silu(g) = g sigmoid(g).
template <typename T>
GNMR_HD_INLINE T swiglu_forward_element(T gate, T up) {
  const T sigmoid = T(1) / (T(1) + exp_vectorizable(-gate));
  return gate * sigmoid * up;
}

// d silu(g)/dg = sigmoid(g) (1 + g (1 - sigmoid(g))); dgate and dup must not alias the inputs'
// buffers at the caller (the inputs are read before the outputs are written here).
template <typename T>
GNMR_HD_INLINE void swiglu_backward_element(T gate, T up, T dout, T& dgate, T& dup) {
  const T sigmoid = T(1) / (T(1) + exp_vectorizable(-gate));
  const T silu = gate * sigmoid;
  dgate = dout * up * sigmoid * (T(1) + gate * (T(1) - sigmoid));
  dup = dout * silu;
}

// AdamW with decoupled weight decay, exactly as torch.optim.AdamW (foreach=False) orders it:
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Algorithm 2.)
struct AdamWCoefficients {
  float beta1, beta2, eps;
  float bias2_sqrt;  // sqrt(1 - beta2^step)
  float step_size;   // lr / (1 - beta1^step)
  float decay;       // 1 - lr weight_decay
};

// Bias corrections in double, then fp32 per element as torch does (host only).
inline AdamWCoefficients adamw_coefficients(const AdamWStep& s) {
  const double t = static_cast<double>(s.step);
  const float bias1 = static_cast<float>(1.0 - pow(static_cast<double>(s.beta1), t));
  const float bias2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(s.beta2), t)));
  AdamWCoefficients c;
  c.beta1 = s.beta1;
  c.beta2 = s.beta2;
  c.eps = s.eps;
  c.bias2_sqrt = bias2_sqrt;
  c.step_size = s.lr / bias1;
  c.decay = 1.0f - s.lr * s.weight_decay;
  return c;
}

// One parameter; grad_scale is the global-norm clip factor.
GNMR_HD_INLINE void adamw_update_element(float& param, float grad, float& m, float& v,
                                         float grad_scale, const AdamWCoefficients& c) {
  const float g = grad * grad_scale;
  const float mi = c.beta1 * m + (1.0f - c.beta1) * g;
  const float vi = c.beta2 * v + (1.0f - c.beta2) * g * g;
  m = mi;
  v = vi;
  const float denom = sqrtf(vi) / c.bias2_sqrt + c.eps;
  param = param * c.decay - c.step_size * mi / denom;
}

// std::isfinite on the bits (an exponent field of all ones is +-inf or NaN), host and device.
GNMR_HD_INLINE bool is_finite_double(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7FF0000000000000ull) != 0x7FF0000000000000ull;
}

// Backend::global_norm_clip: norm = sqrt(sum of sum_squares[i] in index order, in double);
// clip[0] = float(max_norm / norm) when max_norm > 0 and norm > max_norm, else 1;
// clip[1] = 1 when loss_sum and norm are finite, else 0.
GNMR_HD_INLINE void global_norm_clip_values(const double* sum_squares, int64_t count,
                                            double loss_sum, double max_norm, float* clip) {
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += sum_squares[i];
  const double norm = sqrt(total);
  clip[0] = (max_norm > 0 && norm > max_norm) ? static_cast<float>(max_norm / norm) : 1.0f;
  clip[1] = (is_finite_double(loss_sum) && is_finite_double(norm)) ? 1.0f : 0.0f;
}

}  // namespace gnmr
