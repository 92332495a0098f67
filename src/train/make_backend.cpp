#include "train/make_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"
#ifdef GNMR_WITH_CUDA
#include "backend/cuda/device_probe.h"
#endif

namespace gnmr {

std::unique_ptr<Backend> make_backend(const RunConfig& config) {
  if (config.backend == "cpu") {
    std::unique_ptr<Backend> backend = make_cpu_backend(config.train.threads);
    backend->set_gemm_precision(parse_gemm_precision(config.train.gemm_precision));
    return backend;
  }
  if (config.backend == "cuda") {
    // Not built yet either way; a CUDA build also says what this machine's GPU would be.
    std::string found;
#ifdef GNMR_WITH_CUDA
    const CudaDeviceProbe probe = probe_cuda_device(0);
    found = probe.usable ? "; GPU found: " + probe.device
                         : "; and this machine has no usable GPU: " + probe.problem;
#endif
    throw Error(ErrorKind::NotBuilt,
                "backend \"cuda\" is not built yet (this binary has the cpu backend only" + found +
                    "); use backend=cpu");
  }
  throw Error(ErrorKind::Config,
              "config: \"backend\" is \"" + config.backend + "\", not one of cpu, cuda");
}

}  // namespace gnmr
