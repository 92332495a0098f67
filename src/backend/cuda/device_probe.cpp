// The CUDA device probe (device_probe.h).
#include "backend/cuda/device_probe.h"

#include <cuda_runtime.h>

#include <cstdlib>

namespace gnmr {

bool cuda_build_runs_on(int compute_capability) {
  // CMAKE_CUDA_ARCHITECTURES "80;90a": sm_80 code also runs on 8.6 / 8.9 GPUs, but gnmr is only
  // tested (and its FP8 plans made) for A100 and H100/H200.
  return compute_capability == 80 || compute_capability == 90;
}

int visible_cuda_devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

CudaDeviceProbe probe_cuda_device(int index) {
  CudaDeviceProbe p;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice || count == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    p.problem = status == cudaErrorInsufficientDriver
                    ? "no NVIDIA driver, or one older than this CUDA runtime (" +
                          std::to_string(CUDART_VERSION / 1000) + "." +
                          std::to_string(CUDART_VERSION % 1000 / 10) +
                          "); nvidia-smi shows the driver"
                    : std::string("no CUDA device visible") +
                          (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "");
    return p;
  }
  if (status != cudaSuccess) {
    p.problem = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")";
    return p;
  }
  if (index < 0 || index >= count) {
    p.problem = "GPU " + std::to_string(index) + " asked for, " + std::to_string(count) +
                " visible (one process per GPU: the local rank picks it)";
    return p;
  }
  cudaDeviceProp prop{};
  const cudaError_t prop_status = cudaGetDeviceProperties(&prop, index);
  if (prop_status != cudaSuccess) {
    p.problem = std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorName(prop_status);
    return p;
  }
  const int cc = prop.major * 10 + prop.minor;
  p.device = std::string(prop.name) + " (sm_" + std::to_string(cc) + ", " +
             std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
  if (!cuda_build_runs_on(cc)) {
    p.problem = p.device + ": compute capability " + std::to_string(prop.major) + "." +
                std::to_string(prop.minor) + " is not one this build targets (8.0, 9.0)";
    return p;
  }
  p.usable = true;
  return p;
}

}  // namespace gnmr
