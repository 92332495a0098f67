// The GPU's measured bf16 GEMM peak, the figure `gnmr bench` and the trainer's MFU divide by
// (docs/DESIGN.md §6). A size x size x size GEMM through the backend's own cuBLASLt plan (bf16
// operands, fp32 accumulation and output, as the bf16 paths train), its operands made bf16 once
// beforehand so no conversion is timed, and back-to-back runs timed by CUDA events so neither
// the launch nor a host sync is. Needs a GPU.
#pragma once

#include <cstdint>

namespace gnmr {

// GFLOP/s (2 size^3 per GEMM) on device `device`: the best of `repeats` timings of 10 GEMMs
// each, after one warm-up run. Allocates 8 size^2 bytes of its own and frees them. The
// emulated build (tests only) measures at most 256^3.
// Error(Runtime) naming the call when CUDA or cuBLASLt fails.
double bf16_gemm_peak_gflops(int device, int64_t size, int repeats);

}  // namespace gnmr
