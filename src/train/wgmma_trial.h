// The wgmma trial: whether `auto` attention may offer sm_90a's wgmma flash kernels
// (CudaBackendOptions::wgmma_trial), decided by running them in a child process first.
//
// The wgmma kernels were written against the CUDA emulation and checked there; a GPU that runs
// them other than the emulation does could give other bits, which the backend's bits digest
// keeps out of training, or fault, which ends the process that ran them. So before a process
// offers them at an attention shape, it runs `gnmr wgmma-trial` at that shape (at most 2 in
// the batch: the kernels' addressing is the same past it, and the memory small) on its own GPU
// and offers them only where the trial exits 0: each wgmma pass gave the mma.sync passes' bits.
// A trial that fails, faults or passes its deadline leaves the run on mma.sync, with a warning
// naming what happened. It costs a process start and a CUDA context (seconds) per attention
// shape, once per run, on sm_90 GPUs under model.attention auto and bf16 GEMMs only. `gnmr
// train` and `gnmr bench` run it before their process makes its own CUDA context
// (make_backend's planned_attention): a GPU in exclusive-process mode, as clusters often set
// theirs, admits one process's context at a time, so a trial started after that could not run.
//
//   GNMR_AUTO_WGMMA unset   the trial decides (only where gnmr's main() enabled it)
//   GNMR_AUTO_WGMMA=0       never offer the wgmma kernels under auto
//   GNMR_AUTO_WGMMA=1       offer them without a trial (the bits digest still decides)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace gnmr {

using WgmmaTrial = std::function<std::string(const AttentionShape&)>;

// How long a trial may take before it is killed: a CUDA context and a few kernel runs take
// seconds; a hung kernel never ends. make_backend gives it at most half of dist.timeout_s, so
// the other ranks, waiting at the first collective, do not give up on this one first.
constexpr double kWgmmaTrialTimeoutS = 120;

// gnmr's main() names its own executable ("/proc/self/exe"), which runs the trial. In a process
// that names none (a test binary), an unset GNMR_AUTO_WGMMA never offers the wgmma kernels.
void set_wgmma_trial_executable(const std::string& path);

// CudaBackendOptions::wgmma_trial for the GPU `device`, from GNMR_AUTO_WGMMA (above), each trial
// killed after timeout_s and run once per command (shapes that differ in a batch past 2 share
// one); empty where wgmma is never offered. Error(Usage) for a value other than unset, "", "0"
// or "1".
WgmmaTrial wgmma_trial_from_env(int device, double timeout_s = kWgmmaTrialTimeoutS);

// What wgmma_trial_from_env gives where GNMR_AUTO_WGMMA is unset: run_wgmma_trial_process on
// `executable` at each shape asked, once per trial command (its copies share the answers), each
// killed after timeout_s.
WgmmaTrial wgmma_trial_processes(const std::string& executable, int device,
                                 double timeout_s = kWgmmaTrialTimeoutS);

// `executable wgmma-trial --device D --batch B ...` at `shape`, its batch at most 2.
std::vector<std::string> wgmma_trial_command(const std::string& executable, int device,
                                             const AttentionShape& shape);

// Runs wgmma_trial_command as a child process: "" where it exited 0, else what happened ("the
// wgmma trial process (gnmr wgmma-trial ...) was ended by signal 11 (Segmentation fault):
// <its last line>"; "... did not start: ..."). Never throws for the child's sake.
std::string run_wgmma_trial_process(const std::string& executable, int device,
                                    const AttentionShape& shape,
                                    double timeout_s = kWgmmaTrialTimeoutS);

// The trial itself, in the process `gnmr wgmma-trial` runs: flash_wgmma_trial
// (backend/cuda/cuda_backend.h). Error(NotBuilt) in a build without CUDA.
std::string wgmma_trial_in_this_process(int device, const AttentionShape& shape);

}  // namespace gnmr
