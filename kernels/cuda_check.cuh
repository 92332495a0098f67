// GNMR_CUDA_CHECK: the one way CUDA runtime calls are checked. A failure throws gnmr::Error
// naming the call, the CUDA error, the file and line, and a hint.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "util/error.h"

namespace gnmr::cuda {

[[noreturn]] inline void fail_cuda_call(cudaError_t status, const char* call, const char* file,
                                        int line) {
  throw Error(ErrorKind::Runtime,
              std::string("CUDA error ") + cudaGetErrorName(status) + " (" +
                  cudaGetErrorString(status) + ") in `" + call + "` at " + file + ":" +
                  std::to_string(line) +
                  "; hint: check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES), the "
                  "driver supports this CUDA runtime, and device pointers are valid");
}

// A launch's grid y extent of `blocks` blocks: CUDA allows at most 65535 there, so more is an
// error naming `what` (the kernel and what its y counts), not a failed launch.
inline unsigned grid_y(int64_t blocks, const std::string& what) {
  if (blocks > 65535) {
    throw Error(ErrorKind::Runtime, what + ": " + std::to_string(blocks) +
                                        " blocks along the grid's y, above CUDA's 65535");
  }
  return static_cast<unsigned>(blocks);
}

}  // namespace gnmr::cuda

#define GNMR_CUDA_CHECK(call)                                                     \
  do {                                                                            \
    const cudaError_t gnmr_cuda_status_ = (call);                                 \
    if (gnmr_cuda_status_ != cudaSuccess) {                                       \
      ::gnmr::cuda::fail_cuda_call(gnmr_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
