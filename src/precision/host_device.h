// GNMR_HOST_DEVICE: marks a function callable from host code and, when compiled by nvcc,
// from device code. The number formats and per-element quantizers in src/precision use it
// so the CPU reference and the CUDA kernels (kernels/) run the same code bit for bit.
#pragma once

#if defined(__CUDACC__)
#define GNMR_HOST_DEVICE __host__ __device__
#else
#define GNMR_HOST_DEVICE
#endif

// A function defined in a header and shared by host and device code.
#define GNMR_HD_INLINE GNMR_HOST_DEVICE inline

// Host loops over independent rows: OpenMP splits them when the including target is
// compiled with OpenMP (gnmr_precision links it for C++); nvcc-compiled files get a plain loop.
#if defined(_OPENMP)
#define GNMR_PRECISION_PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#else
#define GNMR_PRECISION_PARALLEL_FOR
#endif

#include <cstdint>
#include <cstring>

namespace gnmr {

// Reinterpret float <-> uint32 bits (memcpy is the defined way in C++17 and is folded to a
// register move by gcc and nvcc).
GNMR_HD_INLINE uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

GNMR_HD_INLINE float float_from_bits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// A NaN result as one fixed NaN, +0x7FC00000; any other value unchanged. The CPU and the GPU
// give different bits for the same NaN-making arithmetic: x86 keeps a NaN operand's payload
// and sign and makes 0xFFC00000 from 0 * inf, the GPU always makes 0x7FFFFFFF (first seen on
// an H200, where the fake quantizers' outputs for a tile holding inf or NaN differed only in
// those bits). A shared function whose result is compared bit for bit across the two, and
// that can make a NaN (a code times a scale that is inf or NaN), returns through this.
GNMR_HD_INLINE float canonical_nan(float value) {
  return (float_bits(value) & 0x7FFFFFFFu) > 0x7F800000u ? float_from_bits(0x7FC00000u) : value;
}

}  // namespace gnmr
