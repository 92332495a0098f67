// Four adjacent floats a thread: one 16-byte access where four 4-byte ones would each carry a
// quarter of the bytes. A warp then moves 512 bytes per instruction, and a thread keeps four
// times the bytes in flight, which is what an element-wise kernel's speed comes down to: with
// one float per array per thread, they moved their bytes at 40-70% of an H200's bandwidth (ncu).
// - aligned_quad_elements: how much of a flat element-wise op the four-wide kernel takes.
// - load_quad / store_quad: a lane's four adjacent elements of a row as the FP quantizer
//   kernels move them, four codes stored as one 4-byte word (or four floats as one 16-byte
//   store: the SwiGLU output the pair kernel writes), where the row allows it (the row
//   length a multiple of 4 and the arrays aligned: the kernel's kQuads), else four bounded
//   scalar accesses. Past the row's end: zeros in (|0| changes no absmax), nothing out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace gnmr::cuda {

// v = p[0..3], the elements at or past `available` (p's remaining row length, may be <= 0)
// zero. kQuads: p is 16-byte aligned and available is a multiple of 4.
template <bool kQuads>
__device__ inline void load_quad(const float* p, int64_t available, float (&v)[4]) {
  if (kQuads) {
    const float4 q = available > 0 ? *reinterpret_cast<const float4*>(p) : float4{0, 0, 0, 0};
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    for (int k = 0; k < 4; ++k) v[k] = k < available ? p[k] : 0.0f;
  }
}

// p[0..3] = the four codes of `word` (the first in the low byte: little-endian, as they lie in
// memory), those at or past `available` not written. kQuads: p is 4-byte aligned and available
// a multiple of 4.
template <bool kQuads>
__device__ inline void store_quad(uint8_t* p, int64_t available, uint32_t word) {
  if (kQuads) {
    if (available > 0) *reinterpret_cast<uint32_t*>(p) = word;
  } else {
    for (int k = 0; k < 4; ++k) {
      if (k < available) p[k] = static_cast<uint8_t>(word >> (8 * k));
    }
  }
}

// p[0..3] = v, those at or past `available` not written. kQuads: as load_quad's.
template <bool kQuads>
__device__ inline void store_quad(float* p, int64_t available, const float (&v)[4]) {
  if (kQuads) {
    if (available > 0) *reinterpret_cast<float4*>(p) = float4{v[0], v[1], v[2], v[3]};
  } else {
    for (int k = 0; k < 4; ++k) {
      if (k < available) p[k] = v[k];
    }
  }
}

// The leading elements of a flat [count] op its four-wide kernel takes: all whole quads where
// every array is 16-byte aligned (arena tensors are), else none. The one-element kernel does
// the rest (count % 4, or all of an unaligned call).
inline bool all_16_byte_aligned(std::initializer_list<const void*> arrays) {
  for (const void* a : arrays) {
    if (reinterpret_cast<uintptr_t>(a) % 16 != 0) return false;
  }
  return true;
}
inline int64_t aligned_quad_elements(int64_t count, std::initializer_list<const void*> arrays) {
  return all_16_byte_aligned(arrays) ? count - count % 4 : 0;
}

// A kernel template's kQuads as a compile-time argument, from the host's test:
//   dispatch_quads(quad_rows(x, cols, codes), [&](auto q) {
//     constexpr bool kQuads = decltype(q)::value;
//     kernel<kQuads><<<grid, threads, 0, stream>>>(...);
//   });
// (A named constant, not decltype(q)::value in the launch: the CUDA emulation rewrites launches
// whose template arguments hold no parentheses, tests/emulated_cuda/emulate_kernel_file.sh.)
template <typename Launch>
void dispatch_quads(bool quads, Launch&& launch) {
  if (quads) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
}

// Whether a row-major [rows, cols] fp32 array and its codes take the quad accesses (each row's
// quads aligned too).
inline bool quad_rows(const float* x, int64_t cols, const uint8_t* codes) {
  return cols % 4 == 0 && all_16_byte_aligned({x}) && reinterpret_cast<uintptr_t>(codes) % 4 == 0;
}

}  // namespace gnmr::cuda
