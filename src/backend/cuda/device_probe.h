// Whether this machine can run the CUDA backend, and if not, what is missing, in words a user
// can act on: no driver (or one older than this CUDA runtime), no visible device, or a GPU
// whose compute capability this build has no code for. Asked before anything is allocated.
#pragma once

#include <string>

namespace gnmr {

struct CudaDeviceProbe {
  bool usable = false;
  std::string device;   // "NVIDIA H200 (sm_90, 139 GiB)" when a device was found
  std::string problem;  // empty when usable
};

// How many CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 when there is no
// driver or device (probe_cuda_device says which). Never throws.
int visible_cuda_devices();

// Probes device `index` (the local rank's GPU). Never throws.
CudaDeviceProbe probe_cuda_device(int index);

// The compute capabilities (10 * major + minor) this build has device code for: 80, 90.
bool cuda_build_runs_on(int compute_capability);

}  // namespace gnmr
