// The quantization kernels (kernels/quantize.cuh) against their CPU twins in src/precision:
// packed bytes, codes and scales must be identical, bit for bit. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/quantize_fine_grained.h"
#include "precision/quantize_groupwise.h"
#include "precision/scale_layout.h"

namespace gnmr {
namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible"

// A device copy of a host vector, freed on scope exit.
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

std::vector<float> random_activations(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    x[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(i / cols % 9) - 4);
  }
  for (int64_t i = 0; i < rows * cols; i += 211) x[i] *= 40.0f;  // outliers
  if (cols >= 8) {
    for (int64_t c = 0; c < 8; ++c) x[c] = 0.0f;  // an all-zero stretch (zero group at G = 8)
  }
  return x;
}

// Bit equality of float vectors (also distinguishes -0 from +0).
void expect_same_bits(const std::vector<float>& gpu, const std::vector<float>& cpu,
                      const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_EQ(std::memcmp(gpu.data(), cpu.data(), gpu.size() * sizeof(float)), 0) << what;
}

struct GroupwiseCase {
  int64_t rows, cols;
  GroupwiseSpec spec;
};

TEST(GpuQuantize, IntGroupwiseKernelsWriteTheCpuBytes) {
  SKIP_WITHOUT_GPU();
  std::vector<GroupwiseCase> cases;
  for (int bits : {2, 3, 4, 8}) {
    for (bool stochastic : {false, true}) {
      cases.push_back({37, 512, {bits, 128, stochastic}});
      cases.push_back({16, 256, {bits, 8, stochastic}});
      cases.push_back({5, 255, {bits, kGroupRow, stochastic}});  // odd rows: padded bytes
      cases.push_back({9, 77, {bits, 7, stochastic}});           // odd groups straddle bytes
      cases.push_back({64, 1024, {bits, kGroupTensor, stochastic}});
    }
  }
  const RngKey key{20240917, 12, 5};
  for (const GroupwiseCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << c.rows << "x" << c.cols << " bits " << c.spec.bits << " group "
                 << c.spec.group_size << " stochastic " << c.spec.stochastic);
    const std::vector<float> x = random_activations(c.rows, c.cols, 17 + c.spec.bits);
    std::vector<uint8_t> cpu_packed(packed_bytes(c.rows, c.cols, c.spec));
    std::vector<float> cpu_scales(scale_count(c.rows, c.cols, c.spec));
    std::vector<float> cpu_restored(x.size());
    quantize_int_groupwise(x.data(), c.rows, c.cols, c.spec, cpu_packed.data(), cpu_scales.data(),
                           key);
    dequantize_int_groupwise(cpu_packed.data(), cpu_scales.data(), c.rows, c.cols, c.spec,
                             cpu_restored.data());

    DeviceBuffer<float> d_x(x);
    DeviceBuffer<uint8_t> d_packed(cpu_packed.size());
    DeviceBuffer<float> d_scales(cpu_scales.size());
    DeviceBuffer<float> d_restored(x.size());
    cuda::quantize_int_groupwise(d_x.get(), c.rows, c.cols, c.spec, d_packed.get(), d_scales.get(),
                                 key, nullptr);
    cuda::dequantize_int_groupwise(d_packed.get(), d_scales.get(), c.rows, c.cols, c.spec,
                                   d_restored.get(), nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_bits(d_scales.to_host(), cpu_scales, "scales");
    ASSERT_EQ(d_packed.to_host(), cpu_packed);
    expect_same_bits(d_restored.to_host(), cpu_restored, "dequantized");
  }
}

TEST(GpuQuantize, FpTile1x128KernelWritesTheCpuCodesAndScalesInEitherOrder) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format :
       {FpFormat::kE4M3, FpFormat::kE5M2, FpFormat::kE3M2, FpFormat::kE2M3, FpFormat::kE2M1}) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{33, 300}, {128, 4096}, {3, 5}, {1, 128}, {200, 656}}) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << rows << "x" << cols);
      std::vector<float> x = random_activations(rows, cols, 99);
      x[0] = -0.0f;
      if (x.size() > 2) x[2] = 1e30f;  // a huge outlier: the rest of its tile underflows
      const size_t scale_count = fp_blockwise_scale_count(rows, cols, 1, 128);
      std::vector<uint8_t> cpu_codes(x.size());
      std::vector<float> cpu_scales(scale_count);
      quantize_fp_tile_1x128(x.data(), rows, cols, format, cpu_codes.data(), cpu_scales.data());
      const std::vector<float> vec128_scales = vec128_from_row_tiles(cpu_scales.data(), rows, cols);
      for (cuda::ScaleOrder order : {cuda::ScaleOrder::kCpu, cuda::ScaleOrder::kVec128}) {
        DeviceBuffer<float> d_x(x);
        DeviceBuffer<uint8_t> d_codes(x.size());
        DeviceBuffer<float> d_scales(scale_count);
        cuda::quantize_fp_tile_1x128(d_x.get(), rows, cols, format, order, d_codes.get(),
                                     d_scales.get(), nullptr);
        GNMR_CUDA_CHECK(cudaDeviceSynchronize());
        expect_same_bits(d_scales.to_host(),
                         order == cuda::ScaleOrder::kCpu ? cpu_scales : vec128_scales, "scales");
        ASSERT_EQ(d_codes.to_host(), cpu_codes);
      }
    }
  }
}

TEST(GpuQuantize, InvalidSpecIsAConfigErrorBeforeAnyLaunch) {
  // Needs no device: validation happens on the host.
  try {
    cuda::quantize_int_groupwise(nullptr, 1, 100, GroupwiseSpec{4, 64, false}, nullptr, nullptr,
                                 RngKey{}, nullptr);
    ADD_FAILURE() << "accepted group 64 for 100 columns";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
  }
}

}  // namespace
}  // namespace gnmr
