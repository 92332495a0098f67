// The CPU backend: the numerical reference and the default without a GPU.
// OpenMP across `threads` cores for the fused row-wise ops; GEMMs through OpenBLAS, which
// this backend sets to one thread and drives from its own OpenMP threads (see gemm.cpp).
// Deterministic for a fixed thread count: no float atomics, fixed reduction orders.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace gnmr {

// threads: OpenMP threads for every op; 0 = omp_get_max_threads() (OMP_NUM_THREADS).
// poison (GNMR_POISON=1, a debug mode): allocate() fills activations, saved activations and
// scratch with 0xFF bytes (NaN as f32 and f64) instead of zeros, so a read of memory no op
// wrote shows up as NaN; weights, gradients and optimizer state stay zero (the model relies on
// those zeros). The CUDA backend has the same mode.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0, bool poison = false);

// The softmax probabilities [B, H, T, T] a cpu attention state holds (for tests).
const Tensor& cpu_attention_probs(const AttentionState& state);

// The threads a CPU backend made with `threads` runs on.
int cpu_backend_threads(int threads);

}  // namespace gnmr
