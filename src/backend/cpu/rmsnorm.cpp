// RMSNorm as Hugging Face LlamaRMSNorm: y = w * x / sqrt(mean(x^2) + eps), statistics in fp32
// (here: the row sum of squares accumulated in double, then rounded).
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"

namespace gnmr {
namespace cpu {

template <typename T>
void rmsnorm_forward(const T* x, const T* w, T eps, T* out, T* rstd, int64_t n, int64_t d,
                     int threads) {
  // x, out: [n, d]; w: [d]; rstd: [n]
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const T* xr = x + row * d;
    T* yr = out + row * d;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sum_sq += static_cast<double>(xr[j]) * xr[j];
    const T mean_sq = static_cast<T>(sum_sq / static_cast<double>(d));
    const T r = T(1) / std::sqrt(mean_sq + eps);
    rstd[row] = r;
    for (int64_t j = 0; j < d; ++j) yr[j] = w[j] * (xr[j] * r);
  }
}

int64_t rmsnorm_backward_workspace(int64_t n, int64_t d) {
  return (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows * d;
}

template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dout, T* dx, T* dw, int64_t n,
                      int64_t d, T* workspace, int threads) {
  // With xhat = x r and g = dout * w:
  //   dx = r (g - xhat mean(g xhat)),  dw = sum over rows of dout xhat.
  // workspace: [chunks, d] partial dw sums over kRmsnormChunkRows rows each.
  const int64_t chunks = (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    T* partial = workspace + chunk * d;
    std::fill(partial, partial + d, T(0));
    const int64_t row_end = std::min(n, (chunk + 1) * kRmsnormChunkRows);
    for (int64_t row = chunk * kRmsnormChunkRows; row < row_end; ++row) {
      const T* xr = x + row * d;
      const T* dyr = dout + row * d;
      T* dxr = dx + row * d;
      const T r = rstd[row];
      double dot = 0.0;
      for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(dyr[j] * w[j]) * (xr[j] * r);
      const T mean_dot = static_cast<T>(dot / static_cast<double>(d));
      for (int64_t j = 0; j < d; ++j) {
        const T xhat = xr[j] * r;
        dxr[j] += r * (dyr[j] * w[j] - xhat * mean_dot);
        partial[j] += dyr[j] * xhat;
      }
    }
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t j = 0; j < d; ++j) {
    T sum = T(0);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) sum += workspace[chunk * d + j];
    dw[j] += sum;
  }
}

#define GNMR_INSTANTIATE(T)                                                                  \
  template void rmsnorm_forward<T>(const T*, const T*, T, T*, T*, int64_t, int64_t, int);    \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, \
                                    int64_t, T*, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
