#include "train/make_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "parallel/launch_env.h"
#include "train/wgmma_trial.h"
#include "util/error.h"
#ifdef GNMR_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_probe.h"
#endif

namespace gnmr {

namespace {

// GNMR_POISON=1: the backends' debug mode that fills what nothing may read unwritten with NaN.
// Whether environment variable `name` is "1".
bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool poison_from_env() {
  return env_flag("GNMR_POISON");
}

}  // namespace

#ifdef GNMR_WITH_CUDA
// One GPU per process: the local rank's, or the only one the launcher left visible.
int cuda_device_of_this_process() {
  const GpuChoice gpu = gpu_for_process(read_launch_env(), visible_cuda_devices());
  if (gpu.device < 0) throw Error(ErrorKind::Usage, "backend \"cuda\": " + gpu.problem);
  return gpu.device;
}
#endif

std::unique_ptr<Backend> make_backend(const RunConfig& config,
                                      const std::optional<AttentionShape>& planned_attention) {
  if (config.backend == "cpu") {
    std::unique_ptr<Backend> backend = make_cpu_backend(config.train.threads, poison_from_env());
    backend->set_gemm_precision(parse_gemm_precision(config.train.gemm_precision));
    return backend;
  }
  if (config.backend == "cuda") {
#ifdef GNMR_WITH_CUDA
    CudaBackendOptions options;
    options.device = cuda_device_of_this_process();
    options.poison = poison_from_env();
    options.attention = parse_cuda_attention(config.model.attention);
    options.wgmma_trial = wgmma_trial_from_env(
        options.device, std::min(kWgmmaTrialTimeoutS, config.dist.timeout_s / 2));
    const GemmPrecision gemm_precision = parse_gemm_precision(config.train.gemm_precision);
    if (planned_attention) {
      run_wgmma_trial_before_backend(options, gemm_precision == GemmPrecision::BF16,
                                     *planned_attention);
    }
    std::unique_ptr<Backend> backend = make_cuda_backend(options);
    backend->set_gemm_precision(gemm_precision);
    return backend;
#else
    throw Error(ErrorKind::NotBuilt,
                "backend \"cuda\" is not in this binary (it was built without nvcc, or with "
                "-DGNMR_CUDA=OFF); rebuild with the CUDA toolkit or use backend=cpu");
#endif
  }
  throw Error(ErrorKind::Config,
              "config: \"backend\" is \"" + config.backend + "\", not one of cpu, cuda");
}

std::unique_ptr<Communicator> make_communicator(const RunConfig& config, Backend& backend) {
  CommunicatorOptions options;
  options.kind = config.dist.communicator;
  options.timeout_s = config.dist.timeout_s;
  options.rendezvous = config.dist.rendezvous;
  options.rendezvous_dir = config.dist.rendezvous_dir;
  options.backend = config.backend;
#ifdef GNMR_WITH_CUDA
  if (config.backend == "cuda") {
    const CudaStreamHandle handle = cuda_stream_of(backend);
    options.cuda_device = handle.device;
    options.cuda_stream = handle.stream;
  }
#endif
  return make_communicator(options);
}

}  // namespace gnmr
