// What every gpu test needs: whether a device is visible (the tests skip without one), a
// device copy of a host vector freed on scope exit, random inputs, NaN poisoning, the distance of
// results from a reference, and what the backend logged.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"

namespace gnmr_test {

inline int gpu_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

inline bool have_gpu() {
  return gpu_count() > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!gnmr_test::have_gpu()) GTEST_SKIP() << "no CUDA device visible"

// Skips unless sm_90a's wgmma runs here (the wgmma kernels and checks).
#define SKIP_WITHOUT_WGMMA()                                                      \
  SKIP_WITHOUT_GPU();                                                             \
  do {                                                                            \
    int device = 0;                                                               \
    GNMR_CUDA_CHECK(cudaGetDevice(&device));                                      \
    const std::string why_not = gnmr::cuda::flash_wgmma_unavailable(device);      \
    if (!why_not.empty()) GTEST_SKIP() << "wgmma does not run here: " << why_not; \
  } while (0)

// What spdlog's default logger writes, from info up, while this lives; the logger it replaced
// is back after.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>(
        "captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(text_));
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
};

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    GNMR_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(1, count) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    GNMR_CUDA_CHECK(
        cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return data_; }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    GNMR_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

// n standard-normal floats (never all zeros), reproducible from `seed`.
inline std::vector<float> random_normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// The relative Frobenius distance of `got` from `want` (the absolute one where want is all 0).
template <typename T>
double relative_error(const std::vector<float>& got, const std::vector<T>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// How many of x are inf or NaN.
inline size_t count_non_finite(const std::vector<float>& x) {
  return size_t(std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); }));
}

// Every byte 0xFF: a NaN in fp32, so an element an op skips is visible afterwards.
inline void poison(DeviceBuffer<float>& buf, size_t count) {
  GNMR_CUDA_CHECK(cudaMemset(buf.get(), 0xFF, std::max<size_t>(1, count) * sizeof(float)));
}

}  // namespace gnmr_test
