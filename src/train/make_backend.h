// make_backend: the one place a Backend is made, and the run's communicator for it. `gnmr train`
// (TrainingSession), `gnmr eval` and `gnmr bench` all come here, so a backend is added in this
// file and nowhere else.
#pragma once

#include <memory>
#include <optional>

#include "backend/backend.h"
#include "config/config.h"
#include "parallel/communicator.h"

namespace gnmr {

// config.backend "cpu": the CPU backend on train.threads threads (0 = all cores), its GEMMs at
// train.gemm_precision. "cuda": the CUDA backend on the local rank's GPU (GNMR_POISON=1:
// its NaN-poison debug mode; model.attention picks its attention kernel); Error(Runtime) with the
// reason where no GPU is usable, and Error(NotBuilt) in a build without CUDA. Anything else:
// Error(Config) naming the key. planned_attention: the attention shape the command's model will
// plan, if it is known here; where the cuda backend would run the wgmma trial at it
// (train/wgmma_trial.h), the trial runs before the backend makes this process's CUDA context,
// so that its own process can make one even on a GPU in exclusive-process mode.
std::unique_ptr<Backend> make_backend(
    const RunConfig& config, const std::optional<AttentionShape>& planned_attention = std::nullopt);

#ifdef GNMR_WITH_CUDA
// The GPU this process's cuda backend runs on: its local rank's, or the only one visible
// (gpu_for_process, launch_env.h); Error(Usage) naming the problem when neither works.
int cuda_device_of_this_process();
#endif

// The communicator config.dist asks for (communicator.h), able to sum `backend`'s tensors
// (for nccl: on the cuda backend's stream).
std::unique_ptr<Communicator> make_communicator(const RunConfig& config, Backend& backend);

}  // namespace gnmr
