// Row-wise helpers of the CPU softmax ops, written so gcc vectorizes them. exp_vectorizable
// (Cephes expf) lives in backend/train_math.h, shared with the CUDA kernels.
#pragma once

#include <cstdint>

#include "backend/train_math.h"

namespace gnmr {
namespace cpu {

using gnmr::exp_vectorizable;

// max over x[0, n), n >= 1, in 8 lanes so it vectorizes.
template <typename T>
T row_max(const T* x, int64_t n) {
  T lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = x[0];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] = x[j + l] > lanes[l] ? x[j + l] : lanes[l];
  }
  for (; j < n; ++j) lanes[0] = x[j] > lanes[0] ? x[j] : lanes[0];
  T m = lanes[0];
  for (int l = 1; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

// out[j] = exp(x[j] - shift) for j < n (out may alias x); returns their sum. The sum runs in
// 8 lanes of T over blocks of 512 and adds each block to a double, in a fixed order, so it
// vectorizes, stays deterministic, and loses no accuracy over a 32000-wide row.
template <typename T>
double exp_shifted_sum(const T* x, T shift, T* out, int64_t n) {
  constexpr int64_t kBlockSize = 512;
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlockSize) {
    const int64_t b1 = b0 + kBlockSize < n ? b0 + kBlockSize : n;
    for (int64_t j = b0; j < b1; ++j) out[j] = exp_vectorizable(x[j] - shift);
    T lanes[8] = {};
    int64_t j = b0;
    for (; j + 8 <= b1; j += 8) {
      for (int l = 0; l < 8; ++l) lanes[l] += out[j + l];
    }
    for (; j < b1; ++j) lanes[0] += out[j];
    total += static_cast<double>(((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                                 ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])));
  }
  return total;
}

}  // namespace cpu
}  // namespace gnmr
