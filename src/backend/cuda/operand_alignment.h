// What alignment to promise cuBLASLt's heuristic for an operand. Its preference assumes
// 256-byte-aligned operands unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES),
// and an algorithm chosen under that assumption may fault or fail on a view that sits on a
// smaller boundary (a head's columns, P's T x T matrices at odd T, a tensor_view offset).
#pragma once

#include <cstdint>

namespace gnmr {

// The largest power of two up to 256 that divides the operand's start address, its leading
// dimension in bytes and (batched GEMMs; 0 otherwise) its batch stride in bytes.
inline uint32_t operand_alignment_bytes(const void* start, int64_t ld_bytes,
                                        int64_t batch_stride_bytes = 0) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(start) | static_cast<uintptr_t>(ld_bytes) |
                         static_cast<uintptr_t>(batch_stride_bytes);
  uint32_t align = 256;
  while (align > 1 && bits % align != 0) align /= 2;
  return align;
}

}  // namespace gnmr
