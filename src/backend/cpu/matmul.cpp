// Projection GEMMs, y = x W^T with W [out, in] as Hugging Face stores it.
#include <algorithm>

#include "backend/cpu/ops.h"
#include "precision/bf16.h"

namespace gnmr {
namespace cpu {

template <typename T>
void matmul_forward(const T* x, const T* w, T* y, int64_t n, int64_t in, int64_t out, int threads) {
  // y: [n, out] = x: [n, in] . w^T: [in, out]
  gemm_parallel<T>(false, true, n, out, in, T(1), x, in, w, in, T(0), y, out, threads);
}

template <typename T>
void matmul_backward_input(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out,
                           bool accumulate, int threads) {
  // dx: [n, in] (+)= dy: [n, out] . w: [out, in]
  gemm_parallel<T>(false, false, n, in, out, T(1), dy, out, w, in, accumulate ? T(1) : T(0), dx, in,
                   threads);
}

template <typename T>
void matmul_backward_weight(const T* x, const T* dy, T* dw, int64_t n, int64_t in, int64_t out,
                            int threads) {
  // dw: [out, in] += dy^T: [out, n] . x: [n, in]
  gemm_parallel<T>(true, false, out, in, n, T(1), dy, out, x, in, T(1), dw, in, threads);
}

void round_to_bf16_copy(const float* src, float* dst, int64_t count, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = round_to_bf16(src[i]);
}

#define GNMR_INSTANTIATE(T)                                                                       \
  template void matmul_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int);        \
  template void matmul_backward_input<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool, \
                                         int);                                                    \
  template void matmul_backward_weight<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
