// SwiGLU gate of the LLaMA MLP: out = silu(gate) * up, silu(x) = x sigmoid(x)
// (Hugging Face LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))).
// CUDA twin: kernels/swiglu.cu; both call the elements in backend/train_math.h.

#include "backend/cpu/isa_clones.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/vector_math.h"
#include "backend/train_math.h"

namespace gnmr {
namespace cpu {

namespace {

// The exp in the sigmoid vectorizes only from AVX2 on: ~15x faster than the baseline's scalar
// loop (README "Build").
template <typename T>
GNMR_ISA_CLONES void swiglu_forward_range(const T* gate, const T* up, T* out, int64_t begin,
                                          int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = swiglu_forward_element(gate[i], up[i]);
}

template <typename T>
GNMR_ISA_CLONES void swiglu_backward_range(const T* gate, const T* up, const T* dout, T* dgate,
                                           T* dup, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    swiglu_backward_element(gate[i], up[i], dout[i], dgate[i], dup[i]);
  }
}

}  // namespace

template <typename T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t count, int threads) {
  // gate, up, out: [n, ffn]
  for_each_thread_range(count, threads, [&](int64_t begin, int64_t end) {
    swiglu_forward_range(gate, up, out, begin, end);
  });
}

template <typename T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t count,
                     int threads) {
  for_each_thread_range(count, threads, [&](int64_t begin, int64_t end) {
    swiglu_backward_range(gate, up, dout, dgate, dup, begin, end);
  });
}

#define GNMR_INSTANTIATE(T)                                              \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t, int); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
