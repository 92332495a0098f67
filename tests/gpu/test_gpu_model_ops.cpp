// The model-op kernels (kernels/model_ops.cuh) against their CPU twins, bit for bit: embedding
// forward and the atomic-free backward, RoPE forward and backward, residual add, scale; and the
// host-made embedding index. Skip without a GPU (the index test runs everywhere).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/embedding_index.h"
#include "backend/rope_table.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"
#include "precision/bf16.h"

namespace gnmr {
namespace {

using gnmr_test::DeviceBuffer;

std::vector<float> random_vector(size_t n, uint32_t seed) {
  return gnmr_test::random_normal(n, seed);
}

void expect_same_bits(const std::vector<float>& gpu, const std::vector<float>& cpu,
                      const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << what;
}

TEST(EmbeddingIndex, GroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tokens = {5, 2, 5, 0, 2, 5};
  const EmbeddingIndex index = make_embedding_index(tokens.data(), int64_t(tokens.size()));
  EXPECT_EQ(index.tokens, (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(index.offsets, (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_EQ(index.positions, (std::vector<int32_t>{3, 1, 4, 0, 2, 5}));
}

TEST(GpuModelOps, EmbeddingForwardAndBackwardAreBitExact) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 300, d = 70, vocab = 50;
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = int32_t(rng() % 20);  // many repeats: order matters
  const std::vector<float> table = random_vector(size_t(vocab * d), 2),
                           dout = random_vector(size_t(n * d), 3);
  std::vector<float> out(size_t(n * d)), dtable = random_vector(size_t(vocab * d), 4);
  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_table(table), d_out(out), d_dout(dout), d_dtable(dtable);
  cpu::embedding_forward(tokens.data(), table.data(), out.data(), n, d, 2);
  cuda::embedding_forward(d_tokens.get(), d_table.get(), d_out.get(), n, d, nullptr);
  const EmbeddingIndex index = make_embedding_index(tokens.data(), n);
  DeviceBuffer<int32_t> d_unique(index.tokens), d_offsets(index.offsets),
      d_positions(index.positions);
  cuda::embedding_backward(d_unique.get(), d_offsets.get(), d_positions.get(),
                           int64_t(index.tokens.size()), d_dout.get(), d_dtable.get(), d, nullptr);
  cpu::embedding_backward(tokens.data(), dout.data(), dtable.data(), n, d, 2);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_bits(d_out.to_host(), out, "forward");
  expect_same_bits(d_dtable.to_host(), dtable, "backward");
}

TEST(GpuModelOps, RopeIncludingItsBf16FormsResidualAndScaleAreBitExact) {
  SKIP_WITHOUT_GPU();
  // A token's pairs under one block's threads (3 x 32), and more (9 x 64: the block loops).
  for (auto [heads, hd] : {std::pair<int64_t, int64_t>{3, 64}, {9, 128}}) {
    const int64_t b = 2, t = 33;
    std::vector<float> cos, sin;
    compute_rope_table(10000.0f, int(hd), int(t), cos, sin);
    std::vector<float> x = random_vector(size_t(b * t * heads * hd), 5);
    DeviceBuffer<float> d_x(x), d_cos(cos), d_sin(sin);
    // Either rotation rounded to bf16 into another array (the tensor-core attention's q and k; a
    // bf16 projection's dy), x not written.
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(inverse ? "rope backward to bf16" : "rope forward to bf16");
      std::vector<float> rotated = x;
      if (inverse) {
        cpu::rope_backward(rotated.data(), cos.data(), sin.data(), b, t, heads, hd, 2);
      } else {
        cpu::rope_forward(rotated.data(), cos.data(), sin.data(), b, t, heads, hd, 2);
      }
      std::vector<uint16_t> rotated_bf16(rotated.size());
      for (size_t i = 0; i < rotated.size(); ++i) rotated_bf16[i] = encode_bf16(rotated[i]);
      DeviceBuffer<uint16_t> d_bf16(std::vector<uint16_t>(rotated.size(), 0x7FC1));
      (inverse ? cuda::rope_backward_to_bf16 : cuda::rope_forward_to_bf16)(
          d_x.get(), d_cos.get(), d_sin.get(), b, t, heads, hd, d_bf16.get(), nullptr);
      GNMR_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(d_bf16.to_host(), rotated_bf16);
      expect_same_bits(d_x.to_host(), x, "x, left as it was");
    }
    cpu::rope_forward(x.data(), cos.data(), sin.data(), b, t, heads, hd, 2);
    cuda::rope_forward(d_x.get(), d_cos.get(), d_sin.get(), b, t, heads, hd, nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_bits(d_x.to_host(), x, "rope forward");
    cpu::rope_backward(x.data(), cos.data(), sin.data(), b, t, heads, hd, 2);
    cuda::rope_backward(d_x.get(), d_cos.get(), d_sin.get(), b, t, heads, hd, nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_bits(d_x.to_host(), x, "rope backward");
  }

  const std::vector<float> a = random_vector(1001, 6), c = random_vector(1001, 7);
  std::vector<float> sum(a.size());
  DeviceBuffer<float> d_a(a), d_c(c), d_sum(sum);
  cpu::residual_forward(a.data(), c.data(), sum.data(), int64_t(a.size()), 2);
  cuda::residual_forward(d_a.get(), d_c.get(), d_sum.get(), int64_t(a.size()), nullptr);
  cpu::scale(sum.data(), 0.37f, int64_t(sum.size()), 2);
  cuda::scale(d_sum.get(), 0.37f, int64_t(sum.size()), nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_bits(d_sum.to_host(), sum, "residual then scale");
}

}  // namespace
}  // namespace gnmr
