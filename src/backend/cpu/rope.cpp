// Rotary position embedding, Hugging Face rotate-half convention (apply_rotary_pos_emb):
//   y[i]     = x[i] cos[i] - x[i + hd/2] sin[i]
//   y[i+hd/2] = x[i + hd/2] cos[i] + x[i] sin[i],   i < hd/2, angle from the token position.
// The backward applies the transposed (inverse) rotation. The pair rotation is shared with
// kernels/rope.cu (backend/rope_math.h).
#include "backend/cpu/ops.h"
#include "backend/rope_math.h"

namespace gnmr {
namespace cpu {

namespace {

template <typename T, bool kInverse>
void rotate(T* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
            int64_t hd, int threads) {
  // x: [b, t, heads, hd]; cos, sin: [t, hd / 2]
  const int64_t half = hd / 2;
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (int64_t batch = 0; batch < b; ++batch) {
    for (int64_t pos = 0; pos < t; ++pos) {
      const float* c = cos + pos * half;
      const float* s = sin + pos * half;
      T* row = x + (batch * t + pos) * heads * hd;
      for (int64_t h = 0; h < heads; ++h) {
        T* lo = row + h * hd;
        T* hi = lo + half;
        for (int64_t i = 0; i < half; ++i) {
          rope_rotate_pair(lo[i], hi[i], static_cast<T>(c[i]), static_cast<T>(s[i]), kInverse);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                  int64_t hd, int threads) {
  rotate<T, false>(x, cos, sin, b, t, heads, hd, threads);
}

template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                   int64_t hd, int threads) {
  rotate<T, true>(dx, cos, sin, b, t, heads, hd, threads);
}

#define GNMR_INSTANTIATE(T)                                                                 \
  template void rope_forward<T>(T*, const float*, const float*, int64_t, int64_t, int64_t,  \
                                int64_t, int);                                              \
  template void rope_backward<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, \
                                 int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
