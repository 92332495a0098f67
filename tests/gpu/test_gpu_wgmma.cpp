// How the GPU's wgmma reads the operand layouts the flash attention's wgmma kernels describe
// (src/backend/wgmma_operand.h, kernels/flash_attention_mma.cu). The layouts come from the PTX
// ISA and CUTLASS's documentation, and the CUDA emulation implements that same reading, so only a
// GPU can say whether it is right. One wgmma per form the kernels use (kernels/
// wgmma_operand_check.cu), on an image of distinct small integers (every product exact in
// fp32), against D computed on the host from the descriptors' definition (wgmma_operand_byte)
// and from its likeliest misreadings: LBO and SBO swapped in either operand, B read with the
// other major-ness, the accumulators transposed. The test holds the GPU to the definition; the
// line it prints names every reading the GPU's D matches, so a first GPU run that finds the
// kernels wrong also says which rule to change. Skips where wgmma does not run (sm_90a only).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/wgmma_operand.h"
#include "gpu_test_util.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "precision/bf16.h"

namespace {

using gnmr::cuda::WgmmaCheckOperand;
using gnmr_test::DeviceBuffer;

constexpr int kM = gnmr::kWgmmaM, kN = gnmr::kWgmmaN, kK = gnmr::kWgmmaK;
// 16 KiB: B's tile at 8 KiB, and room past both tiles for a misreading's farthest byte (B
// MN-major with LBO and SBO swapped reaches 7.4 KiB past its start), so that every reading
// tried reads inside the image.
constexpr int kImageBytes = 16 * 1024, kBStart = 8 * 1024;

// The image: bf16 codes of small integers in [-4, 4], a different pattern per region, so
// different readings give different sums.
std::vector<uint16_t> image_codes() {
  std::vector<uint16_t> codes(kImageBytes / 2);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = gnmr::encode_bf16(float(int((i * 7 + i / 61 * 3) % 9) - 4));
  }
  return codes;
}

float image_element(const std::vector<uint16_t>& image, uint32_t byte) {
  return gnmr::decode_bf16(image[byte / 2]);
}

// An operand as the host reads it: element (mn, k) of a 64 x 16 (A) or 64 x 16 (B: n, k) block.
using Operand = std::function<float(int mn, int k)>;

// The operand at `op` read by the descriptor's definition, with LBO and SBO swapped if asked.
Operand read_operand(const std::vector<uint16_t>& image, WgmmaCheckOperand op, bool mn_major,
                     bool swapped) {
  const uint64_t desc = swapped ? gnmr::wgmma_descriptor(op.start, op.sbo, op.lbo)
                                : gnmr::wgmma_descriptor(op.start, op.lbo, op.sbo);
  return [&image, desc, mn_major](int mn, int k) {
    return image_element(image, gnmr::wgmma_operand_byte(desc, mn_major, mn, k));
  };
}

// D[m][n] = sum_k A(m, k) B(n, k), row-major; transposed: D stored as its transpose.
std::vector<float> product(const Operand& a, const Operand& b, bool transposed) {
  std::vector<float> d(size_t(kM) * kN);
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      float sum = 0.0f;  // small integers: exact in any order
      for (int k = 0; k < kK; ++k) sum += a(m, k) * b(n, k);
      d[size_t(transposed ? n * kM + m : m * kN + n)] = sum;
    }
  }
  return d;
}

struct Reading {
  std::string name;
  std::vector<float> d;
};

// The GPU's D against each reading: the names of those it matches ("none" if none).
std::string matching_readings(const std::vector<float>& gpu, const std::vector<Reading>& all) {
  std::string names;
  for (const Reading& r : all) {
    if (r.d == gpu) names += (names.empty() ? "" : ", ") + r.name;
  }
  return names.empty() ? "none" : names;
}

// The first element where the GPU's D and the definition's differ, for the failure message.
std::string first_difference(const std::vector<float>& gpu, const std::vector<float>& expected) {
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] != expected[i]) {
      return "D(" + std::to_string(i / kN) + ", " + std::to_string(i % kN) + "): GPU " +
             std::to_string(gpu[i]) + ", definition " + std::to_string(expected[i]);
    }
  }
  return "none";
}

// S = Q K^T's form: A (a 64-row slab of a query tile, head dim 16) and B (a key tile) both
// K-major in the kernels' tile layout, described by wgmma_scores_operand.
TEST(GpuWgmma, SharedOperandsAreReadAsTheScoresDescriptorsDefineThem) {
  SKIP_WITHOUT_WGMMA();
  const std::vector<uint16_t> image = image_codes();
  const uint64_t a_desc = gnmr::wgmma_scores_operand(0, kK),
                 b_desc = gnmr::wgmma_scores_operand(kBStart, kK);
  const WgmmaCheckOperand a{0, gnmr::wgmma_descriptor_lbo(a_desc),
                            gnmr::wgmma_descriptor_sbo(a_desc)};
  const WgmmaCheckOperand b{kBStart, gnmr::wgmma_descriptor_lbo(b_desc),
                            gnmr::wgmma_descriptor_sbo(b_desc)};
  DeviceBuffer<uint16_t> device_image(image);
  DeviceBuffer<float> d(size_t(kM) * kN);
  gnmr::cuda::wgmma_operand_check(device_image.get(), kImageBytes, a, b, nullptr, d.get(), nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> gpu = d.to_host();

  const auto reading = [&](const char* name, bool a_swapped, bool b_swapped, bool b_mn_major,
                           bool transposed) {
    return Reading{name, product(read_operand(image, a, false, a_swapped),
                                 read_operand(image, b, b_mn_major, b_swapped), transposed)};
  };
  const std::vector<Reading> readings = {
      reading("the definition", false, false, false, false),
      reading("A's LBO and SBO swapped", true, false, false, false),
      reading("B's LBO and SBO swapped", false, true, false, false),
      reading("both operands' LBO and SBO swapped", true, true, false, false),
      reading("B MN-major", false, false, true, false),
      reading("the accumulators transposed", false, false, false, true)};
  std::printf("wgmma, A and B in shared memory (K-major): the GPU's D matches %s\n",
              matching_readings(gpu, readings).c_str());
  EXPECT_EQ(first_difference(gpu, readings[0].d), "none");
}

// O = P V's form: A from registers (each warp's mma.sync A fragment of a 64 x 16 block of P) and
// B a 16-key block of a value tile (head dim 64) MN-major, described by wgmma_values_operand.
TEST(GpuWgmma, RegisterAAndAnMnMajorBAreReadAsTheValuesDescriptorDefinesThem) {
  SKIP_WITHOUT_WGMMA();
  const std::vector<uint16_t> image = image_codes();
  std::vector<uint16_t> a_rows(size_t(kM) * kK);  // row-major 64 x 16
  for (size_t i = 0; i < a_rows.size(); ++i) {
    a_rows[i] = gnmr::encode_bf16(float(int((i * 5 + i / 17) % 7) - 3));
  }
  const uint64_t b_desc = gnmr::wgmma_values_operand(kBStart, kN);
  const WgmmaCheckOperand b{kBStart, gnmr::wgmma_descriptor_lbo(b_desc),
                            gnmr::wgmma_descriptor_sbo(b_desc)};
  DeviceBuffer<uint16_t> device_image(image), device_a(a_rows);
  DeviceBuffer<float> d(size_t(kM) * kN);
  gnmr::cuda::wgmma_operand_check(device_image.get(), kImageBytes, WgmmaCheckOperand{}, b,
                                  device_a.get(), d.get(), nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> gpu = d.to_host();

  const Operand a = [&a_rows](int m, int k) {
    return gnmr::decode_bf16(a_rows[size_t(m * kK + k)]);
  };
  const auto reading = [&](const char* name, bool b_swapped, bool b_mn_major, bool transposed) {
    return Reading{name, product(a, read_operand(image, b, b_mn_major, b_swapped), transposed)};
  };
  const std::vector<Reading> readings = {
      reading("the definition", false, true, false),
      reading("B's LBO and SBO swapped", true, true, false),
      reading("B K-major", false, false, false),
      reading("B K-major with LBO and SBO swapped", true, false, false),
      reading("the accumulators transposed", false, true, true)};
  std::printf("wgmma, A in registers, B in shared memory (MN-major): the GPU's D matches %s\n",
              matching_readings(gpu, readings).c_str());
  EXPECT_EQ(first_difference(gpu, readings[0].d), "none");
}

}  // namespace
