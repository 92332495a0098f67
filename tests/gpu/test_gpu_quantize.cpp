// The quantization kernels (kernels/quantize.cuh) against their CPU twins in src/precision:
// packed bytes, codes and scales must be identical, bit for bit. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/rope_table.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/bf16.h"
#include "precision/fake_quantize_int.h"
#include "precision/quantize_fine_grained.h"
#include "precision/quantize_groupwise.h"
#include "precision/scale_layout.h"
#include "util/error.h"

namespace gnmr {
namespace {

using gnmr_test::DeviceBuffer;

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

// The FP quantizers' per-tile paths (quantize_fp_tile_elements): a NaN element (a NaN
// quotient in a tile that divides by its reciprocal), an inf element (scale inf: the tile
// divides), and, from the middle row on, a row of magnitudes near 1e-30 (scales under 2^-80:
// those tiles divide too), beside ordinary tiles.
void add_fp_tile_edge_cases(std::vector<float>& x, int64_t rows, int64_t cols) {
  if (x.size() > 5) x[5] = std::nanf("");
  if (x.size() > 9) x[x.size() - 9] = -INFINITY;
  if (rows < 3) return;
  for (int64_t c = 0; c < cols; ++c) x[(rows / 2) * cols + c] *= 1e-30f;
}

// Each FP quantizer kernel is one instance per format (src/precision/fp_format_dispatch.h): every
// test runs all five.
constexpr FpFormat kAllFpFormats[] = {FpFormat::kE4M3, FpFormat::kE5M2, FpFormat::kE3M2,
                                      FpFormat::kE2M3, FpFormat::kE2M1};

// Every spec against the CPU's bytes, scales and dequantized floats, and the bf16 form of those
// floats: groups of 128-1024 take the warp-per-group kernel (at 384 and from an x off a 16-byte
// boundary, the general one), the rest the general one. The 128-wide cases hold a NaN, an inf
// (its group's scale is inf), a zero group (scale 0) and -0.0 where the warp kernel reads them.
TEST(GpuQuantize, IntGroupwiseKernelsWriteTheCpuBytes) {
  SKIP_WITHOUT_GPU();
  struct Case {
    GroupwiseCase c;
    bool specials = false;
    bool unaligned_x = false;
  };
  std::vector<Case> cases;
  for (int bits : {2, 3, 4, 8}) {
    for (bool stochastic : {false, true}) {
      cases.push_back({{37, 512, {bits, 128, stochastic}}, true});
      cases.push_back({{6, 2048, {bits, 1024, stochastic}}});
      cases.push_back({{5, 768, {bits, 256, stochastic}}});
      cases.push_back({{3, 768, {bits, 384, stochastic}}});  // 3 chunks: the general kernel
      cases.push_back({{7, 256, {bits, 128, stochastic}}, false, true});
      cases.push_back({{16, 256, {bits, 8, stochastic}}});
      cases.push_back({{5, 255, {bits, kGroupRow, stochastic}}});  // odd rows: padded bytes
      cases.push_back({{9, 77, {bits, 7, stochastic}}});           // odd groups straddle bytes
      cases.push_back({{64, 1024, {bits, kGroupTensor, stochastic}}});
    }
  }
  const RngKey key{20240917, 12, 5};
  for (const Case& k : cases) {
    const GroupwiseCase& c = k.c;
    SCOPED_TRACE(::testing::Message()
                 << c.rows << "x" << c.cols << " bits " << c.spec.bits << " group "
                 << c.spec.group_size << " stochastic " << c.spec.stochastic
                 << (k.unaligned_x ? " x off a 16-byte boundary" : ""));
    std::vector<float> x = random_activations(c.rows, c.cols, 17 + c.spec.bits);
    if (k.specials) {
      x[5] = std::nanf("");
      x[c.cols + 9] = -INFINITY;
      for (int64_t i = 2 * c.cols; i < 2 * c.cols + 128; ++i) x[size_t(i)] = 0.0f;
      x[size_t(2 * c.cols + 3)] = -0.0f;
    }
    std::vector<uint8_t> cpu_packed(packed_bytes(c.rows, c.cols, c.spec));
    std::vector<float> cpu_scales(scale_count(c.rows, c.cols, c.spec));
    std::vector<float> cpu_restored(x.size());
    quantize_int_groupwise(x.data(), c.rows, c.cols, c.spec, cpu_packed.data(), cpu_scales.data(),
                           key);
    dequantize_int_groupwise(cpu_packed.data(), cpu_scales.data(), c.rows, c.cols, c.spec,
                             cpu_restored.data());
    std::vector<uint16_t> cpu_bf16(x.size());
    for (size_t i = 0; i < x.size(); ++i) cpu_bf16[i] = encode_bf16(cpu_restored[i]);

    // An x one float into its buffer is off every 16-byte boundary.
    const size_t offset = k.unaligned_x ? 1 : 0;
    std::vector<float> x_buffer(offset, 0.0f);
    x_buffer.insert(x_buffer.end(), x.begin(), x.end());
    DeviceBuffer<float> d_x(x_buffer);
    DeviceBuffer<uint8_t> d_packed(cpu_packed.size());
    DeviceBuffer<float> d_scales(cpu_scales.size());
    DeviceBuffer<float> d_restored(x.size());
    DeviceBuffer<uint16_t> d_bf16(x.size());
    poison(d_scales, cpu_scales.size()), poison(d_restored, x.size());
    cuda::quantize_int_groupwise(d_x.get() + offset, c.rows, c.cols, c.spec, d_packed.get(),
                                 d_scales.get(), key, nullptr);
    cuda::dequantize_int_groupwise(d_packed.get(), d_scales.get(), c.rows, c.cols, c.spec,
                                   d_restored.get(), nullptr);
    cuda::dequantize_int_groupwise_to_bf16(d_packed.get(), d_scales.get(), c.rows, c.cols, c.spec,
                                           d_bf16.get(), nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_bits(d_scales.to_host(), cpu_scales, "scales");
    ASSERT_EQ(d_packed.to_host(), cpu_packed);
    expect_same_bits(d_restored.to_host(), cpu_restored, "dequantized");
    ASSERT_EQ(d_bf16.to_host(), cpu_bf16) << "dequantized to bf16";
  }
}

TEST(GpuQuantize, FpTile1x128KernelWritesTheCpuCodesAndScalesInEitherOrder) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format : kAllFpFormats) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{33, 300}, {128, 4096}, {3, 5}, {1, 128}, {200, 656}}) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << rows << "x" << cols);
      std::vector<float> x = random_activations(rows, cols, 99);
      add_fp_tile_edge_cases(x, rows, cols);
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

// A kernel's two FP8 operands of one tensor as their CPU twins give them: codes and scales of
// the tensor and of its transpose, the scales in cuBLASLt's order.
struct PairOperands {
  std::vector<uint8_t> codes, codes_t;
  std::vector<float> scales, scales_t;
};
// W's 128x128 blocks (quantize_fp_block_128x128 with blk128_from_blocks), and W^T's (the same
// blocks transposed, so the same scales).
PairOperands cpu_block_128x128_operands(const std::vector<float>& w, int64_t rows, int64_t cols,
                                        FpFormat format) {
  PairOperands p;
  p.codes.resize(w.size());
  std::vector<float> block_scales(fp_blockwise_scale_count(rows, cols, 128, 128));
  quantize_fp_block_128x128(w.data(), rows, cols, format, p.codes.data(), block_scales.data());
  p.codes_t.resize(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) p.codes_t[c * rows + r] = p.codes[r * cols + c];
  p.scales = blk128_from_blocks(block_scales.data(), rows, cols, false);
  p.scales_t = blk128_from_blocks(block_scales.data(), cols, rows, true);
  return p;
}

TEST(GpuQuantize, FpBlock128x128KernelWritesWAndWTransposedOperands) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format : kAllFpFormats) {
    // 300 x 700: partial blocks both ways; L = 6 and 3, so both grids carry L4 padding.
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{300, 700}, {128, 128}, {5, 3}}) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << rows << "x" << cols);
      std::vector<float> w = random_activations(rows, cols, 7);
      add_fp_tile_edge_cases(w, rows, cols);
      const PairOperands cpu = cpu_block_128x128_operands(w, rows, cols, format);
      DeviceBuffer<float> d_w(w);
      DeviceBuffer<uint8_t> d_codes(w.size()), d_codes_t(w.size());
      DeviceBuffer<float> d_scales(blk128_scale_count(rows, cols)),
          d_scales_t(blk128_scale_count(cols, rows));
      // NaN bytes: the kernel writes every entry, the padding's zeros included.
      poison(d_scales, size_t(blk128_scale_count(rows, cols)));
      poison(d_scales_t, size_t(blk128_scale_count(cols, rows)));
      cuda::quantize_fp_block_128x128(d_w.get(), rows, cols, format, d_codes.get(), d_scales.get(),
                                      d_codes_t.get(), d_scales_t.get(), nullptr);
      GNMR_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(d_codes.to_host(), cpu.codes);
      ASSERT_EQ(d_codes_t.to_host(), cpu.codes_t);
      expect_same_bits(d_scales.to_host(), cpu.scales, "W scales");
      expect_same_bits(d_scales_t.to_host(), cpu.scales_t, "W^T scales");
    }
  }
}

// The batched launch (one grid over the blocks of many weights) writes each weight's operands
// as a call of its own would: 80 weights, over 48 of them e4m3 (more than one launch takes),
// the others of every format; shapes with partial blocks, empty ones, some without W^T, and one
// read one float off 16-byte alignment (the one-float path, launched apart). Every buffer
// starts as NaN bytes.
TEST(GpuQuantize, FpBlock128x128BatchWritesEachWeightAsItsOwnCallWould) {
  SKIP_WITHOUT_GPU();
  const std::pair<int64_t, int64_t> shapes[] = {{5, 3}, {129, 257}, {1, 1}, {128, 128}, {0, 7}};
  struct Member {
    int64_t rows, cols;
    FpFormat format;
    bool transposed, offset;
    std::vector<float> w;
    std::unique_ptr<DeviceBuffer<float>> d_w, d_scales, d_scales_t;
    std::unique_ptr<DeviceBuffer<uint8_t>> d_codes, d_codes_t;
  };
  std::vector<Member> members(80);
  std::vector<cuda::FpBlock128x128Weight> batch;
  for (size_t i = 0; i < members.size(); ++i) {
    Member& m = members[i];
    std::tie(m.rows, m.cols) = i == 0 ? std::pair<int64_t, int64_t>{300, 700} : shapes[i % 5];
    m.format = i % 6 == 0 ? kAllFpFormats[i / 6 % std::size(kAllFpFormats)] : FpFormat::kE4M3;
    m.transposed = i % 7 != 3;
    m.offset = i == 11;
    m.w = random_activations(m.rows, m.cols, 100 + static_cast<uint32_t>(i));
    add_fp_tile_edge_cases(m.w, m.rows, m.cols);
    std::vector<float> stored(m.w.size() + 1);
    std::copy(m.w.begin(), m.w.end(), stored.begin() + (m.offset ? 1 : 0));
    const size_t scales = size_t(blk128_scale_count(m.rows, m.cols)),
                 scales_t = size_t(blk128_scale_count(m.cols, m.rows));
    m.d_w = std::make_unique<DeviceBuffer<float>>(stored);
    m.d_codes = std::make_unique<DeviceBuffer<uint8_t>>(m.w.size());
    m.d_codes_t = std::make_unique<DeviceBuffer<uint8_t>>(m.w.size());
    m.d_scales = std::make_unique<DeviceBuffer<float>>(scales);
    m.d_scales_t = std::make_unique<DeviceBuffer<float>>(scales_t);
    poison(*m.d_scales, scales);
    poison(*m.d_scales_t, scales_t);
    batch.push_back({m.d_w->get() + (m.offset ? 1 : 0), m.rows, m.cols, m.format, m.d_codes->get(),
                     m.d_scales->get(), m.transposed ? m.d_codes_t->get() : nullptr,
                     m.transposed ? m.d_scales_t->get() : nullptr});
  }
  cuda::quantize_fp_block_128x128_batch(batch, nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    if (m.w.empty()) continue;
    SCOPED_TRACE(::testing::Message() << "weight " << i << ": " << fp_format_name(m.format) << " "
                                      << m.rows << "x" << m.cols);
    const PairOperands cpu = cpu_block_128x128_operands(m.w, m.rows, m.cols, m.format);
    ASSERT_EQ(m.d_codes->to_host(), cpu.codes);
    expect_same_bits(m.d_scales->to_host(), cpu.scales, "W scales");
    if (!m.transposed) continue;
    ASSERT_EQ(m.d_codes_t->to_host(), cpu.codes_t);
    expect_same_bits(m.d_scales_t->to_host(), cpu.scales_t, "W^T scales");
  }
}

TEST(GpuQuantize, FpTile128x1TransposedKernelWritesTheWeightGradientOperand) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format : kAllFpFormats) {
    for (auto [n, cols] : {std::pair<int64_t, int64_t>{300, 70}, {256, 512}, {1, 3}}) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << n << "x" << cols);
      std::vector<float> x = random_activations(n, cols, 8);
      add_fp_tile_edge_cases(x, n, cols);
      std::vector<uint8_t> cpu_codes(x.size());
      std::vector<float> cpu_scales(fp_blockwise_scale_count(n, cols, 128, 1));
      quantize_fp_blockwise(x.data(), n, cols, 128, 1, format, cpu_codes.data(), cpu_scales.data());
      std::vector<uint8_t> cpu_codes_t(x.size());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < cols; ++c) cpu_codes_t[c * n + t] = cpu_codes[t * cols + c];
      DeviceBuffer<float> d_x(x);
      DeviceBuffer<uint8_t> d_codes_t(x.size());
      DeviceBuffer<float> d_scales(vec128_scale_count(cols, n));
      cuda::quantize_fp_tile_128x1_transposed(d_x.get(), n, cols, format, d_codes_t.get(),
                                              d_scales.get(), nullptr);
      GNMR_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(d_codes_t.to_host(), cpu_codes_t);
      expect_same_bits(d_scales.to_host(), vec128_from_column_tiles(cpu_scales.data(), cols, n),
                       "scales");
    }
  }
}

PairOperands cpu_pair_operands(const std::vector<float>& x, int64_t n, int64_t cols,
                               FpFormat format) {
  PairOperands p;
  std::vector<uint8_t> column_codes(x.size());
  std::vector<float> row_scales(fp_blockwise_scale_count(n, cols, 1, 128));
  std::vector<float> column_scales(fp_blockwise_scale_count(n, cols, 128, 1));
  p.codes.resize(x.size());
  p.codes_t.resize(x.size());
  quantize_fp_tile_1x128(x.data(), n, cols, format, p.codes.data(), row_scales.data());
  quantize_fp_blockwise(x.data(), n, cols, 128, 1, format, column_codes.data(),
                        column_scales.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c) p.codes_t[c * n + t] = column_codes[t * cols + c];
  p.scales = vec128_from_row_tiles(row_scales.data(), n, cols);
  p.scales_t = vec128_from_column_tiles(column_scales.data(), cols, n);
  return p;
}

// Device buffers for a pair kernel's output over [n, cols], compared with the twins'.
struct DevicePairOperands {
  DevicePairOperands(int64_t n, int64_t cols)
      : codes(n * cols),
        codes_t(n * cols),
        scales(vec128_scale_count(n, cols)),
        scales_t(vec128_scale_count(cols, n)) {}
  void expect_equal(const PairOperands& cpu) {
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(codes.to_host(), cpu.codes);
    ASSERT_EQ(codes_t.to_host(), cpu.codes_t);
    expect_same_bits(scales.to_host(), cpu.scales, "row scales");
    expect_same_bits(scales_t.to_host(), cpu.scales_t, "column scales");
  }
  DeviceBuffer<uint8_t> codes, codes_t;
  DeviceBuffer<float> scales, scales_t;
};

// Partial tiles both ways (300 x 70, 129 x 200), whole ones (256 x 512), one element.
const std::pair<int64_t, int64_t> kPairShapes[] = {{300, 70}, {256, 512}, {129, 200}, {1, 1}};
// The fused pair kernels' (fused_pair_takes: rows of whole quads, the formats with FP8 GEMMs).
const std::pair<int64_t, int64_t> kFusedPairShapes[] = {{300, 72}, {256, 512}, {129, 200}, {1, 4}};
const FpFormat kFusedPairFormats[] = {FpFormat::kE4M3, FpFormat::kE3M2, FpFormat::kE2M3,
                                      FpFormat::kE2M1};

TEST(GpuQuantize, FpTile1x128AndTransposedKernelWritesBothBackwardOperandsOfDy) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format : kAllFpFormats) {
    for (auto [n, cols] : kPairShapes) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << n << "x" << cols);
      std::vector<float> x = random_activations(n, cols, 11);
      add_fp_tile_edge_cases(x, n, cols);
      x[0] = 1e30f;  // an outlier: the rest of its row tile and its column tile underflow
      DeviceBuffer<float> d_x(x);
      DevicePairOperands out(n, cols);
      cuda::quantize_fp_tile_1x128_and_transposed(d_x.get(), n, cols, format, out.codes.get(),
                                                  out.scales.get(), out.codes_t.get(),
                                                  out.scales_t.get(), nullptr);
      out.expect_equal(cpu_pair_operands(x, n, cols, format));
    }
  }
}

// The fused MLP forward's x: the SwiGLU output computed from gate and up inside the pair kernel
// is written with the CPU's bits (cpu::swiglu_forward) over poison, and its codes and scales
// are the twins' of that output.
TEST(GpuQuantize, SwigluOutputPairKernelWritesAndQuantizesTheCpusSwigluForward) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format : kFusedPairFormats) {
    for (auto [n, cols] : kFusedPairShapes) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << n << "x" << cols);
      std::vector<float> gate = random_activations(n, cols, 15),
                         up = random_activations(n, cols, 16);
      add_fp_tile_edge_cases(up, n, cols);
      std::vector<float> out(gate.size());
      cpu::swiglu_forward(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()), 1);
      DeviceBuffer<float> d_gate(gate), d_up(up), d_out(std::vector<float>(gate.size(), 7.0f));
      DevicePairOperands codes(n, cols);
      cuda::quantize_swiglu_output_1x128_and_transposed(
          d_gate.get(), d_up.get(), d_out.get(), n, cols, format, codes.codes.get(),
          codes.scales.get(), codes.codes_t.get(), codes.scales_t.get(), nullptr);
      codes.expect_equal(cpu_pair_operands(out, n, cols, format));
      expect_same_bits(d_out.to_host(), out, "the SwiGLU output");
    }
  }
}

// The fused attention backward's dy for q and k: RoPE's backward computed inside the pair kernel
// gives the codes and scales of the CPU's rope_backward (cpu::rope_backward) quantized by the
// pair kernel's twins, bit for bit, dx left unrotated. Head dims 64 and 128 (the two the kernel
// takes), a partial tile each way, the tables longer than the sequence (positions t % T).
TEST(GpuQuantize, RopeGradientPairKernelQuantizesTheCpusRopeBackward) {
  SKIP_WITHOUT_GPU();
  struct RopeCase {
    int64_t b, t, heads, hd;
  };
  for (FpFormat format : {FpFormat::kE4M3, FpFormat::kE3M2, FpFormat::kE2M1}) {
    for (const RopeCase& r : {RopeCase{2, 150, 3, 64}, RopeCase{1, 129, 2, 128},
                              RopeCase{3, 40, 5, 64}, RopeCase{1, 1, 1, 128}}) {
      const int64_t n = r.b * r.t, cols = r.heads * r.hd;
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << r.b << "x" << r.t << "x"
                                        << r.heads << "x" << r.hd);
      std::vector<float> cos, sin;
      compute_rope_table(10000.0f, static_cast<int>(r.hd), static_cast<int>(r.t + 7), cos, sin);
      std::vector<float> dx = random_activations(n, cols, 17);
      add_fp_tile_edge_cases(dx, n, cols);
      std::vector<float> rotated = dx;
      cpu::rope_backward(rotated.data(), cos.data(), sin.data(), r.b, r.t, r.heads, r.hd, 1);
      DeviceBuffer<float> d_dx(dx), d_cos(cos), d_sin(sin);
      ASSERT_TRUE(cuda::rope_gradient_quantizable(r.hd, d_cos.get(), d_sin.get()));
      DevicePairOperands out(n, cols);
      cuda::quantize_rope_gradient_1x128_and_transposed(
          d_dx.get(), d_cos.get(), d_sin.get(), n, r.t, r.heads, r.hd, format, out.codes.get(),
          out.scales.get(), out.codes_t.get(), out.scales_t.get(), nullptr);
      out.expect_equal(cpu_pair_operands(rotated, n, cols, format));
      expect_same_bits(d_dx.to_host(), dx, "dx, unrotated");
    }
  }
  EXPECT_FALSE(cuda::rope_gradient_quantizable(32, nullptr, nullptr));   // pairs across lanes
  EXPECT_FALSE(cuda::rope_gradient_quantizable(256, nullptr, nullptr));  // a head over two tiles
}

// What the fused pair kernels do not take is refused before any launch, naming the kernel:
// e5m2 (no FP8 GEMM), rows that are not whole quads, an array off its 16-byte boundary.
TEST(GpuQuantize, FusedPairKernelsRefuseWhatTheyDoNotTake) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<float> in(4096), out(4096), scales(64);
  DeviceBuffer<uint8_t> codes(4096);
  EXPECT_TRUE(cuda::fused_pair_takes(FpFormat::kE4M3, 64, {in.get(), out.get()}));
  EXPECT_FALSE(cuda::fused_pair_takes(FpFormat::kE5M2, 64, {in.get()}));
  EXPECT_FALSE(cuda::fused_pair_takes(FpFormat::kE4M3, 62, {in.get()}));
  EXPECT_FALSE(cuda::fused_pair_takes(FpFormat::kE4M3, 64, {in.get() + 1}));
  for (auto [format, cols, gate] :
       {std::tuple{FpFormat::kE5M2, int64_t{64}, static_cast<const float*>(in.get())},
        std::tuple{FpFormat::kE4M3, int64_t{62}, static_cast<const float*>(in.get())},
        std::tuple{FpFormat::kE4M3, int64_t{64}, static_cast<const float*>(in.get() + 1)}}) {
    try {
      cuda::quantize_swiglu_output_1x128_and_transposed(gate, in.get(), out.get(), 32, cols, format,
                                                        codes.get(), scales.get(), codes.get(),
                                                        scales.get(), nullptr);
      ADD_FAILURE() << "no error for " << fp_format_name(format) << ", " << cols << " columns";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("quantize_swiglu_output_1x128_and_transposed"),
                std::string::npos)
          << e.what();
    }
  }
}

// The fused MLP backward's dy: dgate and dup computed from gate, up, dout inside the pair kernel
// give the codes and scales of the CPU's SwiGLU backward (cpu::swiglu_backward) quantized by
// the pair kernel's twins, bit for bit, the gradients never written.
TEST(GpuQuantize, SwigluGradientPairKernelQuantizesTheCpusSwigluBackward) {
  SKIP_WITHOUT_GPU();
  for (FpFormat format : kFusedPairFormats) {
    for (auto [n, cols] : kFusedPairShapes) {
      SCOPED_TRACE(::testing::Message() << fp_format_name(format) << " " << n << "x" << cols);
      std::vector<float> gate = random_activations(n, cols, 12),
                         up = random_activations(n, cols, 13),
                         dout = random_activations(n, cols, 14);
      add_fp_tile_edge_cases(dout, n, cols);
      gate[gate.size() / 2] = -90.0f;  // sigmoid underflows to 0: dgate and dup -0 or 0
      std::vector<float> dgate(gate.size()), dup(gate.size());
      cpu::swiglu_backward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(),
                           static_cast<int64_t>(gate.size()), 1);
      DeviceBuffer<float> d_gate(gate), d_up(up), d_dout(dout);
      for (const auto& [which, cpu] : {std::pair{cuda::SwigluGradient::kGate, &dgate},
                                       std::pair{cuda::SwigluGradient::kUp, &dup}}) {
        SCOPED_TRACE(which == cuda::SwigluGradient::kGate ? "dgate" : "dup");
        DevicePairOperands out(n, cols);
        // dup must not read up: it gets none.
        cuda::quantize_swiglu_gradient_1x128_and_transposed(
            d_gate.get(), which == cuda::SwigluGradient::kGate ? d_up.get() : nullptr, d_dout.get(),
            which, n, cols, format, out.codes.get(), out.scales.get(), out.codes_t.get(),
            out.scales_t.get(), nullptr);
        out.expect_equal(cpu_pair_operands(*cpu, n, cols, format));
      }
    }
  }
}

// The FP quantizers code e4m3, e3m2 and e2m3 with the conversion instructions
// (kernels/fp_storage_conversion.cuh): every 32-bit pattern as a quotient on a GPU (a few
// milliseconds a format), the same codes as the codec's. The emulation runs the conversions'
// host versions (cuda_fp8.h) over a stride of all patterns and every pattern from 0.5 below the
// format's largest magnitude up (the saturation, the rounding ties at the top) and near its
// smallest step (the subnormal ties), each sign; with GNMR_EXHAUSTIVE_FLOATS=1 over all 2^32
// too (under 3 minutes for the three).
TEST(GpuQuantize, FpConversionInstructionsGiveTheCodecsCodeForEveryQuotient) {
  SKIP_WITHOUT_GPU();
  cudaDeviceProp prop;
  GNMR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const bool emulated = std::strncmp(prop.name, "emulated", 8) == 0;
  const bool sampled = emulated && std::getenv("GNMR_EXHAUSTIVE_FLOATS") == nullptr;
  for (const FpFormat format : {FpFormat::kE4M3, FpFormat::kE3M2, FpFormat::kE2M3}) {
    SCOPED_TRACE(fp_format_name(format));
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // first pattern, count (stride 1)
    if (sampled) {
      const MinifloatShape shape = minifloat_shape(format);
      const float max = shape.max_value;
      const float step = std::ldexp(1.0f, 1 - shape.exponent_bias - shape.mantissa_bits);
      for (const uint32_t sign : {0u, 0x80000000u}) {
        ranges.push_back({(float_bits(max - 0.5f) | sign), 1u << 16});
        ranges.push_back({(float_bits(step / 4) | sign), 1u << 16});
      }
    } else {
      ranges.push_back({0, uint64_t{1} << 32});
    }
    for (const auto& [first, count] : ranges) {
      const cuda::FpConversionCheck check =
          cuda::check_fp_storage_conversion(format, first, 1, count);
      EXPECT_EQ(check.differences, 0u) << count << " patterns from 0x" << std::hex << first
                                       << ", the first to differ 0x" << check.first_difference_bits;
    }
    if (sampled) {  // a stride over all 2^32, every exponent and sign
      const cuda::FpConversionCheck check =
          cuda::check_fp_storage_conversion(format, 12345, 65537, uint64_t{1} << 16);
      EXPECT_EQ(check.differences, 0u)
          << "the first to differ 0x" << std::hex << check.first_difference_bits;
    }
  }
}

TEST(GpuQuantize, Bf16ConversionAndInt8PerRowMatchTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  std::vector<float> x = random_activations(37, 129, 9);
  x[1] = 1e38f * 3.0f;  // overflows bf16 to inf
  x[2] = std::nanf("1");
  x[3] = -0.0f;
  x[4] = 1.0f + 1.0f / 256;  // a tie: rounds to even
  std::vector<uint16_t> cpu_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) cpu_bf16[i] = encode_bf16(x[i]);
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<uint16_t> d_bf16(x.size());
  cuda::convert_to_bf16(d_x.get(), int64_t(x.size()), d_bf16.get(), nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_EQ(d_bf16.to_host(), cpu_bf16);  // 4773 elements: 1193 four-wide, one alone
  // From element 1 (neither pointer aligned: the one-element kernel alone) and from element 4
  // (both aligned again: the wide kernel, another tail).
  for (const size_t offset : {size_t{1}, size_t{4}}) {
    DeviceBuffer<uint16_t> d_part(x.size());
    cuda::convert_to_bf16(d_x.get() + offset, int64_t(x.size() - offset), d_part.get() + offset,
                          nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> part = d_part.to_host();
    EXPECT_TRUE(
        std::equal(part.begin() + long(offset), part.end(), cpu_bf16.begin() + long(offset)))
        << "from element " << offset;
  }

  // Rows narrower than the block (129) and wider than it with a partial stride (2049), out of
  // place and in place.
  for (const int64_t cols : {int64_t{129}, int64_t{2049}}) {
    const int64_t rows = 37;
    std::vector<float> finite = random_activations(rows, cols, 10);
    finite[size_t(cols - 1)] = 0.0f;
    std::fill(finite.begin() + cols, finite.begin() + 2 * cols, 0.0f);  // an all-zero row
    std::vector<float> cpu_int8(finite.size());
    fake_quantize_int_per_row(finite.data(), rows, cols, 8, cpu_int8.data());
    DeviceBuffer<float> d_in(finite), d_out(finite.size());
    cuda::fake_quantize_int8_per_row(d_in.get(), rows, cols, d_out.get(), nullptr);
    cuda::fake_quantize_int8_per_row(d_in.get(), rows, cols, d_in.get(), nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_bits(d_out.to_host(), cpu_int8,
                     ("int8 per row, cols " + std::to_string(cols)).c_str());
    expect_same_bits(d_in.to_host(), cpu_int8,
                     ("int8 per row in place, cols " + std::to_string(cols)).c_str());
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
