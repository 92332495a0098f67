// The GPU's bf16 GEMM peak (gemm_peak.h).
#include "backend/cuda/gemm_peak.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/gemm_plan.h"
#include "kernels/cuda_check.cuh"
#include "precision/bf16.h"

namespace gnmr {

namespace {

constexpr int kGemmsPerTiming = 10;

// The emulated build (GNMR_CUDA_EMULATED, tests only; docs/DESIGN.md §6) answers cuBLASLt with
// OpenBLAS on the host: there the trainer's 31 GEMMs of 4096^3 took 38 s of every run's start,
// and the figure says nothing about a GPU, so the measurement shrinks to this size.
#ifdef GNMR_CUDA_EMULATED
constexpr int64_t kLargestSize = 256;
#else
constexpr int64_t kLargestSize = INT64_MAX;
#endif

// Device memory and the stream and events of one measurement, released on every path.
struct PeakResources {
  void* a = nullptr;
  void* b = nullptr;
  void* d = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  // Release calls have nothing actionable to report from a destructor.
  ~PeakResources() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
    if (stream) cudaStreamDestroy(stream);
    for (void* p : {d, b, a}) {
      if (p) cudaFree(p);
    }
  }
};

}  // namespace

double bf16_gemm_peak_gflops(int device, int64_t size, int repeats) {
  size = std::min(size, kLargestSize);
  GNMR_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  GNMR_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const GemmPlan plan =
      plan_gemm(GemmRole::kForward, size, size, size, PathSpec{}, GemmPrecision::BF16,
                GpuTarget{prop.major * 10 + prop.minor}, false);
  LtGemmRunner runner;
  PeakResources r;
  const size_t elements = size_t(size) * size_t(size);
  GNMR_CUDA_CHECK(cudaMalloc(&r.a, elements * sizeof(uint16_t)));
  GNMR_CUDA_CHECK(cudaMalloc(&r.b, elements * sizeof(uint16_t)));
  GNMR_CUDA_CHECK(cudaMalloc(&r.d, elements * sizeof(float)));
  // Varied values in [-0.5, 0.5) (constant operands would toggle fewer bits and draw less power
  // than training data does).
  std::vector<uint16_t> host(elements);
  for (size_t i = 0; i < elements; ++i) {
    host[i] = encode_bf16(float((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
  }
  GNMR_CUDA_CHECK(
      cudaMemcpy(r.a, host.data(), elements * sizeof(uint16_t), cudaMemcpyHostToDevice));
  GNMR_CUDA_CHECK(
      cudaMemcpy(r.b, host.data(), elements * sizeof(uint16_t), cudaMemcpyHostToDevice));
  GNMR_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  GNMR_CUDA_CHECK(cudaEventCreate(&r.start));
  GNMR_CUDA_CHECK(cudaEventCreate(&r.stop));

  runner.run(plan, r.a, nullptr, r.b, nullptr, r.d, r.stream);  // warm-up: heuristic, clocks
  GNMR_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  double best = 0.0;
  for (int rep = 0; rep < repeats; ++rep) {
    GNMR_CUDA_CHECK(cudaEventRecord(r.start, r.stream));
    for (int i = 0; i < kGemmsPerTiming; ++i) {
      runner.run(plan, r.a, nullptr, r.b, nullptr, r.d, r.stream);
    }
    GNMR_CUDA_CHECK(cudaEventRecord(r.stop, r.stream));
    GNMR_CUDA_CHECK(cudaEventSynchronize(r.stop));
    float ms = 0.0f;
    GNMR_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    const double flops = 2.0 * double(size) * double(size) * double(size) * kGemmsPerTiming;
    if (ms > 0.0f) best = std::max(best, flops / (double(ms) * 1e-3) * 1e-9);
  }
  return best;
}

}  // namespace gnmr
