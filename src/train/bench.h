// `gnmr bench`: trains a config on synthetic tokens for a fixed number of steps and reports
// throughput, achieved GFLOP/s, MFU against the GEMM peak measured on the same backend,
// peak memory, the backend's allocation by MemoryRole and where the step time goes.
#pragma once

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cpu/blas_autotune.h"
#include "config/config.h"
#include "model/llama.h"

namespace gnmr {

struct BenchOptions {
  int64_t steps = 10;
  int64_t warmup_steps = 2;  // excluded from every figure
  std::string build_id;      // the gnmr measured, for the JSON (cli/build_id.h)
};

// How the backend runs each projection kind's GEMMs on the recipe's low and recovery paths
// (Backend::describe_projection), layer 0's units and the lm_head:
// {"q": {"low": "fp8_block", "recovery": "bf16"}, ..., "lm_head": {"recovery": "bf16"}}.
nlohmann::json projection_gemm_impls(const LlamaModel& model, const Backend& backend);

// NVIDIA's datasheet dense bf16 tensor-core peak (TFLOP/s) of a GPU, from its name as the
// driver reports it: H100 SXM and H200 989.4, H100 NVL and H200 NVL 835, H100 PCIe 756,
// A100 312; 0 when the name is not one of these.
double datasheet_bf16_tflops(const std::string& device);

// Measures the run's backend's GEMM throughput (GFLOP/s), best of `repeats` products of
// [size × size] · [size × size]: the physical limit MFU is quoted against. cpu: the fp32 sgemm
// on a fresh backend made as the run's (make_backend(config)), so its buffers never count in
// the run's memory figures; cuda: cuBLASLt's bf16 GEMM on this process's GPU, on operands of
// its own converted once, timed by CUDA events over back-to-back runs (backend/cuda/gemm_peak.h).
double measure_gemm_peak_gflops(const RunConfig& config, int64_t size = 2048, int repeats = 5);

// The BLAS the run's GEMMs go through (library, version, kernel and how it was chosen, threads,
// nominal rates), as the metrics header line and the bench JSON carry it.
nlohmann::json blas_json(const BlasReport& report);

// The share of the data-parallel gradient sum that backward hid (docs/DESIGN.md §7):
// blocking_sum_ms is one blocking sum of the whole gradient with nothing else running (what
// the step would wait with dist.bucket_mb = 0), wait_ms what the step still waited after its
// backward. 1 - wait / blocking, clamped to [0, 1] (a wait above the blocking sum, e.g. a
// rank arriving late, hides nothing); 0 when there is no sum to hide.
double gradient_sum_hidden_fraction(double blocking_sum_ms, double wait_ms);

// Returns the figures; the last line `gnmr bench` prints is this object. With more than one
// rank it adds gradient_sum_ms (blocking_sum_ms above, the mean of `steps` sums timed after
// the steps), gradient_sum_wait_ms (per step) and gradient_sum_hidden_fraction.
nlohmann::json run_bench(const RunConfig& config, const BenchOptions& options);

}  // namespace gnmr
