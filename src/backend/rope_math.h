// The rotation of one (x[i], x[i + hd/2]) pair of rotary position embedding, Hugging Face's
// rotate-half convention, shared by the CPU loop (cpu/rope.cpp) and the CUDA kernel
// (kernels/rope.cu) so both give the same bits (neither contracts to FMA):
//   forward:  y0 = x0 cos - x1 sin,  y1 = x1 cos + x0 sin
//   backward: the transposed rotation (sin negated).
#pragma once

#include "precision/host_device.h"

namespace gnmr {

template <typename T>
GNMR_HD_INLINE void rope_rotate_pair(T& x0, T& x1, T cos_i, T sin_i, bool inverse) {
  const T s = inverse ? -sin_i : sin_i;
  const T y0 = x0 * cos_i - x1 * s;
  const T y1 = x1 * cos_i + x0 * s;
  x0 = y0;
  x1 = y1;
}

}  // namespace gnmr
