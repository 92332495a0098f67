// GNMR_CUDA_CHECK: the one way CUDA runtime calls are checked. A failure throws gnmr::Error
// naming the call, the CUDA error, the file and line, and a hint.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace gnmr::cuda

#define GNMR_CUDA_CHECK(call)                                                     \
  do {                                                                            \
    const cudaError_t gnmr_cuda_status_ = (call);                                 \
    if (gnmr_cuda_status_ != cudaSuccess) {                                       \
      ::gnmr::cuda::fail_cuda_call(gnmr_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
