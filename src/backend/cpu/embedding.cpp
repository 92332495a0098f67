// Token embedding lookup and its scatter-add backward.
#include <algorithm>
#include <cstring>

#include "backend/cpu/ops.h"

namespace gnmr {
namespace cpu {

template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t d,
                       int threads) {
  // tokens: [n]; table: [vocab, d]; out: [n, d]
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * d, table + static_cast<int64_t>(tokens[i]) * d, sizeof(T) * d);
  }
}

template <typename T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t d,
                        int threads) {
  // dtable[tokens[i]] += dout[i]. Each thread owns a slice of the columns and walks the
  // tokens in order, so repeated tokens add up in a fixed order without atomics.
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(threads, d / 16));
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int64_t slice = 0; slice < slices; ++slice) {
    const int64_t j0 = d * slice / slices;
    const int64_t j1 = d * (slice + 1) / slices;
    for (int64_t i = 0; i < n; ++i) {
      T* row = dtable + static_cast<int64_t>(tokens[i]) * d;
      const T* src = dout + i * d;
      for (int64_t j = j0; j < j1; ++j) row[j] += src[j];
    }
  }
}

#define GNMR_INSTANTIATE(T)                                                                \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int); \
  template void embedding_backward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
