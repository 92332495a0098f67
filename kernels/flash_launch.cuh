// Host-side checks and launch of the flash-attention kernels (kernels/flash_attention.cu, the
// SIMT kernels, and kernels/flash_attention_mma.cu, the tensor-core ones): the shape checks and
// the grid and shared-memory limits, each failing with the shape in the message.
#pragma once

#include <climits>
#include <string>

#include "backend/flash_layout.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "util/error.h"

namespace gnmr::cuda::flash_launch {

inline std::string shape_text(const FlashDims& s, int64_t head_dim) {
  return "B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
         " H=" + std::to_string(s.heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " hd=" + std::to_string(head_dim);
}

inline void check_shape(const FlashDims& s, int64_t head_dim) {
  if (!flash_attention_supports_head_dim(head_dim)) {
    throw Error(ErrorKind::Config, "flash attention: head_dim " + std::to_string(head_dim) + " (" +
                                       shape_text(s, head_dim) +
                                       ") is not supported; the kernels are built for head dims "
                                       "64 and 128; use model.attention=materialized");
  }
  GNMR_CHECK(
      s.batch >= 0 && s.seq >= 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
      "flash attention: heads must be a multiple of kv_heads (" + shape_text(s, head_dim) + ")");
  GNMR_CHECK(
      s.seq < (int64_t{1} << 31),
      "flash attention: the kernels count positions in 31 bits (" + shape_text(s, head_dim) + ")");
}

// A 1-D grid of `blocks` (checked against the hardware's 2^31 - 1) with `bytes` of dynamic
// shared memory (opted in per kernel; checked against the device's limit).
template <typename Kernel>
unsigned launch_blocks(Kernel kernel, int64_t blocks, int64_t bytes, const FlashDims& s,
                       int64_t head_dim, const char* what) {
  if (blocks > INT_MAX) {
    throw Error(ErrorKind::Runtime, std::string("flash attention ") + what + ": " +
                                        std::to_string(blocks) + " thread blocks for " +
                                        shape_text(s, head_dim) + " exceed the grid limit 2^31-1");
  }
  int device = 0, limit = 0;
  GNMR_CUDA_CHECK(cudaGetDevice(&device));
  GNMR_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > limit) {
    throw Error(ErrorKind::Runtime,
                std::string("flash attention ") + what + ": needs " + std::to_string(bytes) +
                    " bytes of shared memory per block for " + shape_text(s, head_dim) +
                    ", the device allows " + std::to_string(limit) +
                    "; use model.attention=materialized on this GPU");
  }
  GNMR_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return unsigned(blocks);
}

}  // namespace gnmr::cuda::flash_launch
