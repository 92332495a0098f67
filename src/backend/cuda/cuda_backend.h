// The CUDA backend (docs/DESIGN.md §6): Backend on one GPU. Tensors live in device memory
// (DeviceMemory, fp32 / i32 / f64 as the seam says); every op is queued on one stream; the
// projections run on cuBLASLt (cuda_projection.h), attention v1 on cuBLASLt batched GEMMs
// and a causal-softmax kernel; the rest are the kernels in kernels/, each tested against its
// CPU twin (tests/gpu). copy_to_host and synchronize are its only waits for the device.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace gnmr {

struct CudaBackendOptions {
  int device = 0;       // the GPU (the local rank's)
  bool poison = false;  // GNMR_POISON=1: fill activations and scratch with NaN bytes
};

// Error(Runtime) naming the problem when device `options.device` cannot run this build
// (probe_cuda_device).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

}  // namespace gnmr
