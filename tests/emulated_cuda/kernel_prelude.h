// Included first by every kernels/*.cu file that emulate_kernel_file.sh turns into host C++:
// CUDA's keywords become plain C++ and its device built-ins the emulation's (emulated_cuda.h).
// - __global__ / __device__ / __host__ / __launch_bounds__: nothing (host functions);
// - __shared__: `static`. Blocks run one after another and a block's threads share one OS
//   thread, so a function-local static is one array shared by the block's threads, as shared
//   memory is;
// - cudaFuncSetAttribute's overload for a kernel pointer, as nvcc's cuda_runtime.h has it;
// - __syncthreads, __syncwarp (the whole warp's), __shfl_xor_sync, atomicMax, __float_as_uint,
// __uint_as_float: the
//   emulation's (an atomic is a plain read-modify-write: one OS thread runs every thread); the C
//   math functions the host's libm (CUDA's expf / logf may differ in the last bit).
#pragma once

#include <cuda_runtime.h>
#include <math.h>  // device code has the C math functions (fmaxf, expf...) unqualified

#include <cstdint>
#include <cstring>

#include "emulated_cuda/emulated_cuda.h"

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#define __syncthreads() ::gnmr::cuda::emulated_syncthreads()
#define __syncwarp(...) ::gnmr::cuda::emulated_syncwarp()

// cuda_runtime.h's C++ overloads taking the kernel itself (nvcc only).
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
template <typename T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, T* entry) {
  return ::cudaFuncGetAttributes(attributes, reinterpret_cast<const void*>(entry));
}

namespace gnmr::cuda {

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  return warp_shuffle_xor(mask, value, lane_mask);
}

inline unsigned atomicMax(unsigned* address, unsigned value) {
  const unsigned old = *address;
  if (value > old) *address = value;
  return old;
}

inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace gnmr::cuda
