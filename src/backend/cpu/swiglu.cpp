// SwiGLU gate of the LLaMA MLP: out = silu(gate) * up, silu(x) = x sigmoid(x)
// (Hugging Face LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))).
// CUDA twin: kernels/swiglu.cu.
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/vector_math.h"

namespace gnmr {
namespace cpu {

template <typename T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t count, int threads) {
  // gate, up, out: [n, ffn]
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const T g = gate[i];
    const T sigmoid = T(1) / (T(1) + exp_vectorizable(-g));
    out[i] = g * sigmoid * up[i];
  }
}

template <typename T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t count,
                     int threads) {
  // d silu(g)/dg = sigmoid(g) (1 + g (1 - sigmoid(g)))
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const T g = gate[i];
    const T sigmoid = T(1) / (T(1) + exp_vectorizable(-g));
    const T silu = g * sigmoid;
    dgate[i] = dout[i] * up[i] * sigmoid * (T(1) + g * (T(1) - sigmoid));
    dup[i] = dout[i] * silu;
  }
}

#define GNMR_INSTANTIATE(T)                                              \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t, int); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
