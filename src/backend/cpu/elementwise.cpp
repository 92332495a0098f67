// Elementwise ops: residual add, in-place scale.
#include "backend/cpu/ops.h"

namespace gnmr {
namespace cpu {

template <typename T>
void residual_forward(const T* a, const T* b, T* out, int64_t count, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void scale(T* x, T factor, int64_t count, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) x[i] *= factor;
}

#define GNMR_INSTANTIATE(T)                                                \
  template void residual_forward<T>(const T*, const T*, T*, int64_t, int); \
  template void scale<T>(T*, T, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
