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

// CUDA's limit on a launch's grid y extent.
constexpr int64_t kMaxGridY = 65535;

// A launch's grid y extent of `blocks` blocks, for a kernel whose block y is its item: more
// than kMaxGridY is an error naming `what` (the kernel and what its y counts), not a failed
// launch.
inline unsigned grid_y(int64_t blocks, const std::string& what) {
  if (blocks > kMaxGridY) {
    throw Error(ErrorKind::Runtime, what + ": " + std::to_string(blocks) +
                                        " blocks along the grid's y, above CUDA's " +
                                        std::to_string(kMaxGridY));
  }
  return static_cast<unsigned>(blocks);
}

// The grid y extent for `items` along y of a kernel that strides over them by gridDim.y.
inline unsigned strided_grid_y(int64_t items) {
  return static_cast<unsigned>(items < kMaxGridY ? items : kMaxGridY);
}

}  // namespace gnmr::cuda

#define GNMR_CUDA_CHECK(call)                                                     \
  do {                                                                            \
    const cudaError_t gnmr_cuda_status_ = (call);                                 \
    if (gnmr_cuda_status_ != cudaSuccess) {                                       \
      ::gnmr::cuda::fail_cuda_call(gnmr_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
