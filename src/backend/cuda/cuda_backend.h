// The CUDA backend (docs/DESIGN.md §6): Backend on one GPU. Tensors live in device memory
// (DeviceMemory, fp32 / i32 / f64 as the seam says); every op is queued on one stream; the
// projections run on cuBLASLt (cuda_projection.h), attention on the flash kernels or v1's
// cuBLASLt batched GEMMs and causal-softmax kernel (cuda_attention.h); the rest are the kernels in
// kernels/, each tested against its CPU twin (tests/gpu). copy_to_host and synchronize are its only
// waits for the device in a steady-state step (docs/DESIGN.md §6 names the others).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace gnmr {

// model.attention: Flash runs kernels/flash_attention.cu (fp32 SIMT; out and the log-sum-exp
// saved), FlashBf16 kernels/flash_attention_mma.cu (the same algorithm on bf16 tensor cores:
// q, k, v, dout, P and dS rounded to bf16 where they enter a product, fp32 accumulation and
// statistics), Materialized the v1 attention (attention_v1.h, P [B, H, T, T] saved), Auto the
// flash kernels in the run's GEMM precision where they support the head dim (64, 128) and fit
// the device's shared memory, v1 elsewhere: the tensor-core ones under train.gemm_precision
// bf16 (25-60x the SIMT kernels' TFLOP/s on an H200: README), the fp32 SIMT ones under fp32.
// Chosen per layer at plan_attention.
enum class CudaAttention { Auto, Flash, FlashBf16, FlashWgmma, Materialized };

// "auto" | "flash" | "flash_bf16" | "flash_wgmma" | "materialized", else Error(Config) naming
// model.attention.
CudaAttention parse_cuda_attention(const std::string& name);

// The tensor-core flash kernels' variants (backend/cuda/flash_kernel_choice.h): Timed runs each
// query tile (64 and 128 rows; the dq pass only at head dim 64) and, under attention Auto on a
// device with sm_90a's wgmma, each instruction whose bits are mma.sync's at each attention
// shape's first forward and backward, and then the fastest; Defaults runs mma.sync (wgmma under
// FlashWgmma) at kFlashMmaForwardQueryTile and flash_mma_query_pass_tile (backend/flash_layout.h);
// Auto is Timed on a GPU and Defaults on the CUDA emulation (where a kernel's time says nothing
// about a GPU's). The same bits either way.
enum class FlashTiles { Auto, Timed, Defaults };

struct CudaBackendOptions {
  int device = 0;       // the GPU (the local rank's)
  bool poison = false;  // GNMR_POISON=1: fill activations and scratch with NaN bytes
  CudaAttention attention = CudaAttention::Auto;
  FlashTiles flash_tiles = FlashTiles::Auto;
  // Under attention Auto with the tiles timed, on a device that runs wgmma: whether the wgmma
  // kernels may be offered to the timed choice at an attention shape, asked once per shape at
  // its first plan: "" yes (then they join where they give the mma.sync kernels' bits,
  // backend/cuda/flash_kernel_choice.h), else why not (logged as a warning; mma.sync runs).
  // The bits digest keeps other bits out of training, but a kernel that faults ends the process,
  // which no check inside it can catch: make_backend answers by running flash_wgmma_trial in a
  // child process (train/wgmma_trial.h). Unset: never offered.
  std::function<std::string(const AttentionShape&)> wgmma_trial;
};

// Error(Runtime) naming the problem when device `options.device` cannot run this build
// (probe_cuda_device).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

// Asks options.wgmma_trial at `shape` now, where a backend made with `options` would ask it at
// that shape's first plan_attention (attention auto under bf16 GEMMs, the tensor-core flash
// kernels at this shape, the tiles timed, a device of compute capability 9.0), and does nothing
// elsewhere. make_backend calls it before it makes the backend, so before this process has a
// CUDA context (the device is read through attributes, which make none): a GPU in
// exclusive-process mode admits one process's context at a time, and the trial runs in a process
// of its own. wgmma_trial_from_env's trials answer once per command (train/wgmma_trial.h), so
// the backend then finds this answer made.
void run_wgmma_trial_before_backend(const CudaBackendOptions& options, bool bf16_gemms,
                                    const AttentionShape& shape);

// The trial of the wgmma flash kernels at `shape` on GPU `device`, for a process of its own
// (`gnmr wgmma-trial`, train/wgmma_trial.h): a backend under attention Auto with the tiles timed
// runs one forward and one backward on random q, k, v and dout, the wgmma passes beside the
// mma.sync ones as training would. "" where every wgmma pass gave the mma.sync passes' bits;
// else which did not, or why wgmma was not offered (no sm_90a, the shape). A CUDA error throws;
// a fault ends the process.
std::string flash_wgmma_trial(int device, const AttentionShape& shape);

// Where a cuda backend queues its work, for a communicator that must order its collectives
// with it (the nccl communicator). Error(Usage) when `backend` is not the cuda backend.
struct CudaStreamHandle {
  int device = 0;
  void* stream = nullptr;  // cudaStream_t
};
CudaStreamHandle cuda_stream_of(Backend& backend);

}  // namespace gnmr
