// exp for the row-wise CPU ops, written so gcc vectorizes it (no calls, no branches):
// Cephes expf — range reduction x = n ln2 + r with ln2 split in two, a degree-5 minimax
// polynomial for e^r on |r| <= ln2 / 2, 2^n assembled in the exponent bits. Max error about
// 2 ulp over [-87, 88]; below -87 it returns 0 (the softmax and sigmoid uses only need the
// underflow to be monotone).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gnmr {
namespace cpu {

inline float exp_vectorizable(float x) {
  x = x < 88.0f ? x : 88.0f;
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
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return er * two_n;
}

// The double reference path keeps libm.
inline double exp_vectorizable(double x) {
  return std::exp(x);
}

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
