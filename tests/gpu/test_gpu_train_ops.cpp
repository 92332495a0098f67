// The training-op kernels (kernels/train_ops.cuh) against their CPU twins on random non-zero
// inputs with odd sizes: bit for bit for the elementwise ops (SwiGLU, AdamW, bf16 rounding, the
// fp fake quantizer) and the reductions made to follow the CPU's order (sum_squares,
// global_norm_clip, accumulate_mean_loss, rmsnorm's dw); within a stated tolerance where the
// kernel sums in another order (rmsnorm's row statistics, cross-entropy's log-sum-exp), and
// then the same bits on a second run. Outputs start as NaN, so a missed element shows.
// Skip without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/bits_digest.h"
#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "precision/bf16.h"
#include "precision/fp_format.h"
#include "precision/host_device.h"

namespace gnmr {
namespace {

using gnmr_test::DeviceBuffer;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_vector(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

std::vector<float> nan_vector(size_t n) {
  return std::vector<float>(n, kNaN);
}

template <typename T>
void expect_same_bits(const std::vector<T>& gpu, const std::vector<T>& cpu, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  if (cpu.empty()) return;  // (memcmp must not see an empty vector's null data)
  EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * sizeof(T)), 0) << what;
}

// |gpu - cpu| <= rel * (1 + |cpu|) for every element, and no NaN where the CPU has none.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, float rel,
                  const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < cpu.size() && failures < 5; ++i) {
    const bool ok = std::fabs(gpu[i] - cpu[i]) <= rel * (1.0f + std::fabs(cpu[i]));
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << ", cpu " << cpu[i];
    }
  }
}

void sync() {
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
}

// The row statistics are doubles summed in another order than the CPU's (a relative difference
// near 1e-16), so their f32 rounding differs by at most 1 ulp; through the rsqrt and the
// products that is a few ulp (~3e-7 relative) of the O(1) outputs here. 2e-6 leaves a wide
// margin; a wrong formula misses by O(1).
constexpr float kRmsnormTolerance = 2e-6f;

TEST(GpuTrainOps, RmsnormForwardMatchesCpuIsDeterministicAndTakesTheResidualAddAndBf16InItsPass) {
  SKIP_WITHOUT_GPU();
  // d = 70: an element per load; d = 1028: four (and more quads than the block's threads).
  for (const int64_t d : {70, 1028}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const int64_t n = 37;
    const float eps = 1e-5f;
    const std::vector<float> x = random_vector(size_t(n * d), 1), w = random_vector(size_t(d), 2);
    std::vector<float> out(size_t(n * d)), rstd(static_cast<size_t>(n));
    cpu::rmsnorm_forward<float>(x.data(), w.data(), eps, out.data(), rstd.data(), n, d, 2);
    DeviceBuffer<float> d_x(x), d_w(w), d_out(nan_vector(out.size())),
        d_rstd(nan_vector(rstd.size()));
    cuda::rmsnorm_forward(d_x.get(), d_w.get(), eps, d_out.get(), d_rstd.get(), n, d, nullptr);
    sync();
    const std::vector<float> gpu_out = d_out.to_host(), gpu_rstd = d_rstd.to_host();
    expect_close(gpu_out, out, kRmsnormTolerance, "out");
    expect_close(gpu_rstd, rstd, kRmsnormTolerance, "rstd");
    cuda::rmsnorm_forward(d_x.get(), d_w.get(), eps, d_out.get(), d_rstd.get(), n, d, nullptr);
    sync();
    expect_same_bits(d_out.to_host(), gpu_out, "out, second run");
    expect_same_bits(d_rstd.to_host(), gpu_rstd, "rstd, second run");
    // The residual add in the same pass: x = a + b written as residual_forward writes it, out and
    // rstd the bits of rmsnorm_forward of that sum (the same kernel's reduction).
    const std::vector<float> b = random_vector(size_t(n * d), 3);
    std::vector<float> a(x.size());
    for (size_t i = 0; i < x.size(); ++i) a[i] = x[i] - b[i];
    std::vector<float> sum(x.size());
    cpu::residual_forward<float>(a.data(), b.data(), sum.data(), n * d, 2);
    DeviceBuffer<float> d_a(a), d_b(b), d_sum(nan_vector(sum.size())), d_sum_alone(sum);
    cuda::rmsnorm_forward(d_sum_alone.get(), d_w.get(), eps, d_out.get(), d_rstd.get(), n, d,
                          nullptr);
    sync();
    const std::vector<float> alone_out = d_out.to_host(), alone_rstd = d_rstd.to_host();
    DeviceBuffer<float> d_out2(nan_vector(out.size())), d_rstd2(nan_vector(rstd.size()));
    cuda::residual_rmsnorm_forward(d_a.get(), d_b.get(), d_sum.get(), d_w.get(), eps, d_out2.get(),
                                   d_rstd2.get(), n, d, nullptr);
    sync();
    expect_same_bits(d_sum.to_host(), sum, "residual sum");
    expect_same_bits(d_out2.to_host(), alone_out, "out of the sum");
    expect_same_bits(d_rstd2.to_host(), alone_rstd, "rstd of the sum");
    // A bf16 projection's x from the same pass (out_bf16): out, sum and rstd the same bits, and
    // out rounded to bf16 as encode_bf16 rounds it (convert_to_bf16's bits). At d = 1028 the
    // quad kernel's 8-byte stores; at d = 70 the one-element kernel's.
    std::vector<uint16_t> out_bf16(alone_out.size());
    for (size_t i = 0; i < alone_out.size(); ++i) out_bf16[i] = encode_bf16(alone_out[i]);
    DeviceBuffer<float> d_sum3(nan_vector(sum.size())), d_out3(nan_vector(out.size())),
        d_rstd3(nan_vector(rstd.size()));
    DeviceBuffer<uint16_t> d_out_bf16(std::vector<uint16_t>(out_bf16.size(), 0x7FC1));
    cuda::residual_rmsnorm_forward(d_a.get(), d_b.get(), d_sum3.get(), d_w.get(), eps, d_out3.get(),
                                   d_rstd3.get(), n, d, nullptr, d_out_bf16.get());
    sync();
    expect_same_bits(d_sum3.to_host(), sum, "residual sum, with bf16");
    expect_same_bits(d_out3.to_host(), alone_out, "out of the sum, with bf16");
    expect_same_bits(d_rstd3.to_host(), alone_rstd, "rstd of the sum, with bf16");
    EXPECT_EQ(d_out_bf16.to_host(), out_bf16);
  }
}

TEST(GpuTrainOps, RmsnormBackwardMatchesCpuWithBitExactDwAndWritesTheBf16OfDx) {
  SKIP_WITHOUT_GPU();
  // 3 chunks of kRmsnormChunkRows rows, the last partial. Rows of 70 and 1030 (an element per
  // load), 1028, 2052 and 4100 (four): the one-pass kernel at 1, 2 and 3 groups of columns a
  // thread (70, 1028, 2052), and the row and chunk kernels where a thread's share of a row is
  // more than its registers take (1030, 4100).
  for (const int64_t d : {70, 1030, 1028, 2052, 4100}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const int64_t n = 77;
    const float eps = 1e-5f;
    const std::vector<float> x = random_vector(size_t(n * d), 3), w = random_vector(size_t(d), 4),
                             dout = random_vector(size_t(n * d), 5),
                             dx0 = random_vector(size_t(n * d), 6),
                             dw0 = random_vector(size_t(d), 7);
    std::vector<float> out(size_t(n * d)), rstd(static_cast<size_t>(n));
    cpu::rmsnorm_forward<float>(x.data(), w.data(), eps, out.data(), rstd.data(), n, d, 2);
    std::vector<float> dx = dx0, dw = dw0;
    std::vector<float> cpu_workspace(size_t(cpu::rmsnorm_backward_workspace(n, d)));
    cpu::rmsnorm_backward<float>(x.data(), w.data(), rstd.data(), dout.data(), dx.data(), dw.data(),
                                 n, d, cpu_workspace.data(), 2);
    const int64_t workspace_floats = cuda::rmsnorm_backward_workspace_floats(n, d);
    EXPECT_EQ(workspace_floats, cpu::rmsnorm_backward_workspace(n, d));
    // The CPU's rstd on both sides: dw then depends on nothing summed in another order.
    DeviceBuffer<float> d_x(x), d_w(w), d_rstd(rstd), d_dout(dout), d_dx(dx0), d_dw(dw0),
        d_workspace(nan_vector(size_t(workspace_floats)));
    cuda::rmsnorm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_dout.get(), d_dx.get(), d_dw.get(),
                           n, d, d_workspace.get(), nullptr);
    sync();
    const std::vector<float> gpu_dx = d_dx.to_host(), gpu_dw = d_dw.to_host();
    expect_close(gpu_dx, dx, kRmsnormTolerance, "dx");
    expect_same_bits(gpu_dw, dw, "dw");
    // Run twice from the same start: the same bits.
    DeviceBuffer<float> d_dx2(dx0), d_dw2(dw0);
    cuda::rmsnorm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_dout.get(), d_dx2.get(),
                           d_dw2.get(), n, d, d_workspace.get(), nullptr);
    sync();
    expect_same_bits(d_dx2.to_host(), gpu_dx, "dx, second run");
    expect_same_bits(d_dw2.to_host(), gpu_dw, "dw, second run");
    // With the bf16 copy of dx (a bf16 projection's dy): dx and dw the same bits, and the copy
    // dx rounded as encode_bf16 rounds it, from every kernel above.
    std::vector<uint16_t> dx_bf16(gpu_dx.size());
    for (size_t i = 0; i < gpu_dx.size(); ++i) dx_bf16[i] = encode_bf16(gpu_dx[i]);
    DeviceBuffer<float> d_dx3(dx0), d_dw3(dw0);
    DeviceBuffer<uint16_t> d_dx_bf16(std::vector<uint16_t>(dx_bf16.size(), 0x7FC1));
    cuda::rmsnorm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_dout.get(), d_dx3.get(),
                           d_dw3.get(), n, d, d_workspace.get(), nullptr, d_dx_bf16.get());
    sync();
    expect_same_bits(d_dx3.to_host(), gpu_dx, "dx, with bf16");
    expect_same_bits(d_dw3.to_host(), gpu_dw, "dw, with bf16");
    EXPECT_EQ(d_dx_bf16.to_host(), dx_bf16);
  }
}

TEST(GpuTrainOps, SwigluForwardAndBackwardAreBitExactAndSoAreTheirBf16Gradients) {
  SKIP_WITHOUT_GPU();
  const int64_t count = 37 * 70 + 3;
  // stddev 8: gates past the exp's clamps (|g| > 87) are rare, so add some by hand
  std::vector<float> gate = random_vector(size_t(count), 8, 8.0f);
  gate[0] = 100.0f;
  gate[1] = -100.0f;
  gate[2] = 0.0f;
  const std::vector<float> up = random_vector(size_t(count), 9),
                           dout = random_vector(size_t(count), 10);
  std::vector<float> out(static_cast<size_t>(count)), dgate(static_cast<size_t>(count)),
      dup(static_cast<size_t>(count));
  cpu::swiglu_forward<float>(gate.data(), up.data(), out.data(), count, 2);
  cpu::swiglu_backward<float>(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), count,
                              2);
  DeviceBuffer<float> d_gate(gate), d_up(up), d_dout(dout), d_out(nan_vector(out.size())),
      d_dgate(nan_vector(dgate.size())), d_dup(nan_vector(dup.size()));
  cuda::swiglu_forward(d_gate.get(), d_up.get(), d_out.get(), count, nullptr);
  cuda::swiglu_backward(d_gate.get(), d_up.get(), d_dout.get(), d_dgate.get(), d_dup.get(), count,
                        nullptr);
  sync();
  expect_same_bits(d_out.to_host(), out, "forward");
  expect_same_bits(d_dgate.to_host(), dgate, "dgate");
  expect_same_bits(d_dup.to_host(), dup, "dup");
  // A bf16 projection's x from the fused MLP forward: out as above, and its bf16 rounding.
  {
    std::vector<uint16_t> out_bf16(out.size());
    for (size_t i = 0; i < out.size(); ++i) out_bf16[i] = encode_bf16(out[i]);
    DeviceBuffer<float> d_out2(nan_vector(out.size()));
    DeviceBuffer<uint16_t> d_out_bf16(std::vector<uint16_t>(out.size(), 0x7FC1));
    cuda::swiglu_forward_with_bf16(d_gate.get(), d_up.get(), d_out2.get(), d_out_bf16.get(), count,
                                   nullptr);
    sync();
    expect_same_bits(d_out2.to_host(), out, "forward with bf16");
    EXPECT_EQ(d_out_bf16.to_host(), out_bf16);
  }
  // A bf16 projection's dy from the fused MLP backward: each gradient rounded to bf16 as
  // encode_bf16 rounds the CPU's, over the four-wide kernel and the tail (count % 4 = 1), and
  // over the one-element kernel alone (from an element off the 16-byte boundary). dup reads no up.
  for (const int64_t offset : {0, 1}) {
    const int64_t n = count - offset;
    for (const bool up_gradient : {false, true}) {
      SCOPED_TRACE(testing::Message() << (up_gradient ? "dup" : "dgate") << ", from " << offset);
      const std::vector<float>& cpu = up_gradient ? dup : dgate;
      std::vector<uint16_t> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) expected[size_t(i)] = encode_bf16(cpu[size_t(i + offset)]);
      DeviceBuffer<uint16_t> d_bf16(std::vector<uint16_t>(size_t(n), 0x7FC1));
      cuda::swiglu_gradient_to_bf16(d_gate.get() + offset,
                                    up_gradient ? nullptr : d_up.get() + offset,
                                    d_dout.get() + offset, up_gradient, d_bf16.get(), n, nullptr);
      sync();
      EXPECT_EQ(d_bf16.to_host(), expected);
    }
  }
}

// The two sides sum exp(x - max) in different orders, the kernel rescaling partial sums by
// exp(m - max) up to log2(512) + 1 times per term (each rescale within ~2.5 ulp): the sums agree
// within ~30 f32 ulp (2e-6 relative) in the worst case. That is the error of the loss (absolute,
// log) and of the gradient's scale (relative); 1e-5 leaves 5x. At the target the gradient is
// dloss (p - 1): its error is dloss p times that, bounded by 1e-5 (|g| + |dloss|).
constexpr float kCrossEntropyTolerance = 1e-5f;

TEST(GpuTrainOps, CrossEntropyMatchesCpuIsDeterministicAndWritesTheBf16Gradient) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t n, vocab;
  };
  for (const Case c : {Case{37, 1003}, Case{5, 32003}}) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << ", vocab " << c.vocab);
    const std::vector<float> logits = random_vector(size_t(c.n * c.vocab), 11, 3.0f);
    std::mt19937 rng(12);
    std::vector<int32_t> targets(size_t(c.n));
    for (int32_t& t : targets) t = int32_t(rng() % uint32_t(c.vocab));
    targets[1] = -1;
    targets[size_t(c.n) - 1] = int32_t(c.vocab) - 1;
    const float dloss = 1.0f / 29.0f;

    std::vector<float> losses(size_t(c.n)), fb_losses(size_t(c.n)), grad = logits;
    cpu::cross_entropy_forward<float>(logits.data(), targets.data(), losses.data(), c.n, c.vocab,
                                      2);
    cpu::cross_entropy_forward_backward<float>(grad.data(), targets.data(), fb_losses.data(), dloss,
                                               c.n, c.vocab, 2);
    DeviceBuffer<float> d_logits(logits), d_grad(logits), d_losses(nan_vector(losses.size())),
        d_fb_losses(nan_vector(losses.size()));
    DeviceBuffer<int32_t> d_targets(targets);
    cuda::cross_entropy_forward(d_logits.get(), d_targets.get(), d_losses.get(), c.n, c.vocab,
                                nullptr);
    cuda::cross_entropy_forward_backward(d_grad.get(), d_targets.get(), d_fb_losses.get(), dloss,
                                         c.n, c.vocab, nullptr);
    sync();
    const std::vector<float> gpu_losses = d_losses.to_host(), gpu_grad = d_grad.to_host();
    expect_close(gpu_losses, losses, kCrossEntropyTolerance, "losses");
    expect_same_bits(d_fb_losses.to_host(), gpu_losses, "forward_backward's losses");
    EXPECT_EQ(gpu_losses[1], 0.0f);
    int failures = 0;
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t j = 0; j < c.vocab && failures < 5; ++j) {
        const size_t at = size_t(i * c.vocab + j);
        if (targets[size_t(i)] < 0) {
          EXPECT_EQ(float_bits(gpu_grad[at]), 0u) << "ignored row " << i;
          continue;
        }
        const float tol = kCrossEntropyTolerance *
                          (std::fabs(grad[at]) + (j == targets[size_t(i)] ? dloss : 0.0f));
        if (!(std::fabs(gpu_grad[at] - grad[at]) <= tol)) {
          ++failures;
          ADD_FAILURE() << "grad[" << i << ", " << j << "]: gpu " << gpu_grad[at] << ", cpu "
                        << grad[at];
        }
      }
    }
    // A second run gives the same bits.
    DeviceBuffer<float> d_grad2(logits);
    cuda::cross_entropy_forward(d_logits.get(), d_targets.get(), d_losses.get(), c.n, c.vocab,
                                nullptr);
    cuda::cross_entropy_forward_backward(d_grad2.get(), d_targets.get(), d_fb_losses.get(), dloss,
                                         c.n, c.vocab, nullptr);
    sync();
    expect_same_bits(d_losses.to_host(), gpu_losses, "losses, second run");
    expect_same_bits(d_grad2.to_host(), gpu_grad, "gradient, second run");
    // With grad_bf16 (the lm_head's bf16 dy): the same losses, the gradient's bf16 rounding
    // (encode_bf16 of the fp32 gradient above: convert_to_bf16's bits), and logits unchanged.
    std::vector<uint16_t> grad_bf16(gpu_grad.size());
    for (size_t i = 0; i < gpu_grad.size(); ++i) grad_bf16[i] = encode_bf16(gpu_grad[i]);
    DeviceBuffer<float> d_logits3(logits), d_fb_losses3(nan_vector(losses.size()));
    DeviceBuffer<uint16_t> d_grad_bf16(std::vector<uint16_t>(grad_bf16.size(), 0x7FC1));
    cuda::cross_entropy_forward_backward(d_logits3.get(), d_targets.get(), d_fb_losses3.get(),
                                         dloss, c.n, c.vocab, nullptr, d_grad_bf16.get());
    sync();
    expect_same_bits(d_fb_losses3.to_host(), gpu_losses, "losses, with bf16");
    EXPECT_EQ(d_grad_bf16.to_host(), grad_bf16);
    expect_same_bits(d_logits3.to_host(), logits, "logits, left as they were");
  }
}

// A NaN logit makes the row's loss and gradient NaN on both sides, wherever it falls: first in
// a thread's stride (where the kernel has no max yet), later in it, or alone in a row of -inf.
TEST(GpuTrainOps, CrossEntropyOfANanLogitIsNanAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 4, vocab = 1003;
  std::vector<float> logits = random_vector(size_t(n * vocab), 14, 3.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  logits[0] = nan;                        // row 0: thread 0's first element
  logits[size_t(1 * vocab + 700)] = nan;  // row 1: thread 188's second element
  std::fill(logits.begin() + 2 * vocab, logits.begin() + 3 * vocab, -INFINITY);
  logits[size_t(2 * vocab + 5)] = nan;                 // row 2: a NaN among -inf only
  const std::vector<int32_t> targets = {7, 3, 9, 11};  // row 3 stays finite
  std::vector<float> losses(static_cast<size_t>(n));
  cpu::cross_entropy_forward<float>(logits.data(), targets.data(), losses.data(), n, vocab, 2);
  DeviceBuffer<float> d_logits(logits), d_grad(logits), d_losses(nan_vector(size_t(n)));
  DeviceBuffer<int32_t> d_targets(targets);
  cuda::cross_entropy_forward(d_logits.get(), d_targets.get(), d_losses.get(), n, vocab, nullptr);
  sync();
  const std::vector<float> gpu_losses = d_losses.to_host();
  cuda::cross_entropy_forward_backward(d_grad.get(), d_targets.get(), d_losses.get(), 0.5f, n,
                                       vocab, nullptr);
  sync();
  const std::vector<float> gpu_grad = d_grad.to_host();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isnan(losses[size_t(i)])) << "cpu, row " << i;
    EXPECT_TRUE(std::isnan(gpu_losses[size_t(i)])) << "gpu, row " << i;
    EXPECT_TRUE(std::isnan(gpu_grad[size_t(i * vocab + 1)])) << "gpu gradient, row " << i;
  }
  EXPECT_TRUE(std::isfinite(gpu_losses[3]));
  EXPECT_NEAR(gpu_losses[3], losses[3], kCrossEntropyTolerance);
}

TEST(GpuTrainOps, AccumulateMeanLossIsBitExact) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5003;  // more than two staged tiles
  std::vector<float> losses = random_vector(size_t(n), 13);
  for (float& l : losses) l = std::fabs(l) * 3.0f;
  double cpu_sum = 1.25;
  DeviceBuffer<float> d_losses(losses);
  DeviceBuffer<double> d_sum(std::vector<double>{1.25});
  for (int64_t valid : {int64_t{4321}, int64_t{n}}) {
    cpu::accumulate_mean_loss(losses.data(), n, valid, &cpu_sum);
    cuda::accumulate_mean_loss(d_losses.get(), n, valid, d_sum.get(), nullptr);
  }
  sync();
  expect_same_bits(d_sum.to_host(), std::vector<double>{cpu_sum}, "loss sum");
}

TEST(GpuTrainOps, SumSquaresIsBitExactAcrossChunksAndBatches) {
  SKIP_WITHOUT_GPU();
  // Empty, tiny, unaligned (a 1-3 element tail), one chunk, a chunk and one, several chunks; and
  // more tensors than one kernel batch takes. A warp sums eight chunks, so the chunks of
  // neighbouring tensors share warps, with their lengths and tails unlike.
  std::vector<int64_t> counts = {0, 1, 3, 70, 65536, 65537, 200003};
  std::mt19937 rng(14);
  while (counts.size() < 150) counts.push_back(int64_t(rng() % 3000));
  counts[100] = 131075;
  counts[120] = 65536 * 9 + 258;  // a warp's eight chunks, and a ninth of 2 slices and 2
  std::vector<std::vector<float>> host;
  std::vector<const float*> host_ptrs;
  for (size_t t = 0; t < counts.size(); ++t) {
    host.push_back(random_vector(size_t(counts[t]), uint32_t(100 + t), 1.0f + float(t % 7)));
    host_ptrs.push_back(host.back().data());
  }
  const int64_t num = int64_t(counts.size());
  std::vector<double> cpu_out(counts.size());
  cpu::sum_squares(host_ptrs.data(), counts.data(), num, cpu_out.data(), 2);
  // Each tensor at offset 0 of its buffer (16-byte aligned: the kernel's 16-byte loads) and
  // at offset 1 float (its 4-byte loads).
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    std::vector<std::unique_ptr<DeviceBuffer<float>>> device;
    std::vector<const float*> device_ptrs;
    for (size_t t = 0; t < counts.size(); ++t) {
      std::vector<float> padded(offset, std::nanf(""));
      padded.insert(padded.end(), host[t].begin(), host[t].end());
      padded.push_back(std::nanf(""));  // a read past the end shows
      device.push_back(std::make_unique<DeviceBuffer<float>>(padded));
      device_ptrs.push_back(device.back()->get() + offset);
    }
    const int64_t workspace_doubles = cuda::sum_squares_workspace_doubles(counts.data(), num);
    DeviceBuffer<double> d_workspace(static_cast<size_t>(workspace_doubles)),
        d_out(std::vector<double>(counts.size(), std::nan("")));
    cuda::sum_squares(device_ptrs.data(), counts.data(), num, d_out.get(), d_workspace.get(),
                      nullptr);
    sync();
    expect_same_bits(d_out.to_host(), cpu_out, "sum of squares");
    cuda::sum_squares(device_ptrs.data(), counts.data(), num, d_out.get(), d_workspace.get(),
                      nullptr);
    sync();
    expect_same_bits(d_out.to_host(), cpu_out, "sum of squares, second run");
  }
}

// The digest's kernel against its CPU twin: a grid-strided sum over a few passes of the fixed
// grid and a ragged end, then one word changed by one bit, which must change the digest.
TEST(GpuTrainOps, BitsDigestIsTheCpuTwinsAndChangesWithOneWord) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{256 * 256 * 3 + 17}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<uint32_t> words(static_cast<size_t>(count));
    for (uint32_t& w : words) w = rng();
    DeviceBuffer<uint32_t> d_words(words);
    DeviceBuffer<uint64_t> partials(cuda::kBitsDigestPartials);
    const uint64_t digest = cuda::bits_digest(d_words.get(), count, partials.get(), nullptr);
    EXPECT_EQ(digest, bits_digest(words.data(), count));
    if (count == 0) {
      EXPECT_EQ(digest, 0u);
      continue;
    }
    words[size_t(count) / 2] ^= 1u << 7;
    DeviceBuffer<uint32_t> changed(words);
    EXPECT_NE(cuda::bits_digest(changed.get(), count, partials.get(), nullptr), digest);
  }
}

TEST(GpuTrainOps, GlobalNormClipIsBitExact) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::vector<double> sums;
    double loss, max_norm;
  };
  const std::vector<Case> cases = {
      {{0.3, 1.7, 2.25}, 3.5, 1.0},           // clipped
      {{0.3, 1.7, 2.25}, 3.5, 10.0},          // under the limit
      {{0.3, 1.7, 2.25}, 3.5, 0.0},           // clipping off
      {{0.3, 1.7, 2.25}, std::nan(""), 1.0},  // non-finite loss
      {{0.3, inf, 2.25}, 3.5, 1.0},           // non-finite norm
      {{0.3, std::nan(""), 2.25}, 3.5, 1.0}, {{}, 2.0, 1.0},
  };
  for (const Case& c : cases) {
    float cpu_clip[2];
    cpu::global_norm_clip(c.sums.data(), int64_t(c.sums.size()), c.loss, c.max_norm, cpu_clip);
    DeviceBuffer<double> d_sums(c.sums.empty() ? std::vector<double>{0.0} : c.sums),
        d_loss(std::vector<double>{c.loss});
    DeviceBuffer<float> d_clip(nan_vector(2));
    cuda::global_norm_clip(d_sums.get(), int64_t(c.sums.size()), d_loss.get(), c.max_norm,
                           d_clip.get(), nullptr);
    sync();
    expect_same_bits(d_clip.to_host(), std::vector<float>{cpu_clip[0], cpu_clip[1]}, "clip");
  }
}

TEST(GpuTrainOps, AdamwIsBitExactAndWritesNothingOnASkippedStep) {
  SKIP_WITHOUT_GPU();
  const int64_t count = 10007;
  const std::vector<float> param0 = random_vector(size_t(count), 15),
                           grad = random_vector(size_t(count), 16),
                           m0 = random_vector(size_t(count), 17, 0.1f);
  std::vector<float> v0 = random_vector(size_t(count), 18, 0.01f);
  for (float& v : v0) v = v * v;
  AdamWStep s;
  s.lr = 3e-3f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.step = 7;
  std::vector<float> param = param0, m = m0, v = v0;
  const float grad_scale = 0.731f;
  cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), count, s, grad_scale, 2);
  DeviceBuffer<float> d_param(param0), d_grad(grad), d_m(m0), d_v(v0),
      d_clip(std::vector<float>{grad_scale, 1.0f});
  cuda::adamw_update(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), count, s, d_clip.get(),
                     nullptr);
  sync();
  expect_same_bits(d_param.to_host(), param, "param");
  expect_same_bits(d_m.to_host(), m, "m");
  expect_same_bits(d_v.to_host(), v, "v");

  DeviceBuffer<float> skip_param(param0), skip_m(m0), skip_v(v0),
      skip_clip(std::vector<float>{grad_scale, 0.0f});
  cuda::adamw_update(skip_param.get(), d_grad.get(), skip_m.get(), skip_v.get(), count, s,
                     skip_clip.get(), nullptr);
  sync();
  expect_same_bits(skip_param.to_host(), param0, "param after a skipped step");
  expect_same_bits(skip_m.to_host(), m0, "m after a skipped step");
  expect_same_bits(skip_v.to_host(), v0, "v after a skipped step");
}

// A step's tensors in one batch, over three launches (70 > 32 a launch): each tensor's bits as
// the CPU twin's alone, whatever its size (one element, a partial quad, a partial block, several
// blocks), its alignment (one tensor's arrays start one float off a 16-byte boundary: scalar
// accesses) and its weight decay; an empty tensor is skipped; and a skipped step writes nothing.
TEST(GpuTrainOps, AdamwBatchGivesEachTensorItsOwnBitsAndWritesNothingOnASkippedStep) {
  SKIP_WITHOUT_GPU();
  std::vector<int64_t> counts;
  for (int i = 0; i < 70; ++i) counts.push_back(int64_t{1 + (i * 977) % 9000});
  counts[3] = 1, counts[4] = 3, counts[5] = 4096, counts[6] = 4097, counts[7] = 0;
  counts[8] = 3 * 4096 + 5;
  const size_t misaligned = 9;  // its arrays start one float into their buffers
  const float grad_scale = 0.731f;
  // Per tensor: param, grad, m, v as the host made them, one float of padding in front for the
  // misaligned tensor, and their device copies.
  std::vector<std::vector<std::vector<float>>> host(counts.size());
  std::vector<std::unique_ptr<DeviceBuffer<float>>> device;
  std::vector<cuda::AdamWTensor> batch;
  const auto pad_of = [&](size_t t) { return t == misaligned ? size_t{1} : size_t{0}; };
  for (size_t t = 0; t < counts.size(); ++t) {
    const size_t n = size_t(counts[t]) + pad_of(t);
    for (int a = 0; a < 4; ++a) {
      std::vector<float> x =
          random_vector(n, uint32_t(100 + 4 * t + size_t(a)), a < 2 ? 1.0f : 0.1f);
      if (a == 3) {
        for (float& e : x) e = e * e;  // v >= 0
      }
      device.push_back(std::make_unique<DeviceBuffer<float>>(x.empty() ? nan_vector(1) : x));
      host[t].push_back(std::move(x));
    }
    AdamWStep s;
    s.lr = 3e-3f;
    s.weight_decay = t % 2 == 0 ? 0.1f : 0.0f;
    s.step = 7;
    float* d[4];
    for (size_t a = 0; a < 4; ++a) d[a] = device[4 * t + a]->get() + pad_of(t);
    batch.push_back(cuda::AdamWTensor{d[0], d[1], d[2], d[3], counts[t], s});
  }
  // Array a of tensor t, without its padding: on the device, and as `want` holds it.
  const auto on_device = [&](size_t t, size_t a) {
    const std::vector<float> all = device[4 * t + a]->to_host();
    return std::vector<float>(all.begin() + long(pad_of(t)),
                              all.begin() + long(pad_of(t) + size_t(counts[t])));
  };
  const auto unpadded = [&](const std::vector<float>& x, size_t t) {
    return std::vector<float>(x.begin() + long(pad_of(t)), x.end());
  };
  const char* names[4] = {"param", "grad", "m", "v"};

  DeviceBuffer<float> skip_clip(std::vector<float>{grad_scale, 0.0f});
  cuda::adamw_update_batch(batch, skip_clip.get(), nullptr);
  sync();
  for (size_t t = 0; t < counts.size(); ++t) {
    SCOPED_TRACE("a skipped step, tensor " + std::to_string(t));
    for (size_t a : {0, 2, 3}) expect_same_bits(on_device(t, a), unpadded(host[t][a], t), names[a]);
  }

  DeviceBuffer<float> clip(std::vector<float>{grad_scale, 1.0f});
  cuda::adamw_update_batch(batch, clip.get(), nullptr);
  sync();
  for (size_t t = 0; t < counts.size(); ++t) {
    SCOPED_TRACE("tensor " + std::to_string(t) + " of " + std::to_string(counts[t]) + " elements");
    std::vector<std::vector<float>> want = host[t];
    const size_t pad = pad_of(t);
    cpu::adamw_update(want[0].data() + pad, want[1].data() + pad, want[2].data() + pad,
                      want[3].data() + pad, counts[t], batch[t].step, grad_scale, 1);
    for (size_t a : {0, 2, 3}) expect_same_bits(on_device(t, a), unpadded(want[a], t), names[a]);
  }
}

TEST(GpuTrainOps, FakeQuantizeFpBlockwiseIsBitExactForEveryFormatAndBlockShape) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 200, cols = 300;  // partial edge blocks for every shape below
  std::vector<float> x = random_vector(size_t(rows * cols), 19, 2.0f);
  for (int64_t c = 0; c < cols; ++c) x[size_t(5 * cols + c)] = 0.0f;  // all-zero 1 x t blocks
  for (int64_t r = 0; r < rows; ++r) x[size_t(r * cols + 7)] = 0.0f;  // an all-zero column
  x[size_t(3 * cols + 11)] = std::numeric_limits<float>::infinity();
  x[size_t(150 * cols + 299)] = kNaN;
  x[size_t(10 * cols + 40)] = 1e-30f;  // subnormal in every format after scaling
  struct Shape {
    int64_t block_rows, block_cols;
  };
  const FpFormat formats[] = {FpFormat::kE4M3, FpFormat::kE5M2, FpFormat::kE3M2, FpFormat::kE2M3,
                              FpFormat::kE2M1};
  for (const FpFormat format : formats) {
    for (const Shape shape : {Shape{1, 128}, Shape{128, 1}, Shape{128, 128}, Shape{1, 32},
                              Shape{3, 5}, Shape{64, 64}}) {
      SCOPED_TRACE(testing::Message() << "format " << static_cast<int>(format) << ", block "
                                      << shape.block_rows << " x " << shape.block_cols);
      std::vector<float> expected(x.size());
      cpu::fake_quantize_fp_blockwise(x.data(), rows, cols, format, shape.block_rows,
                                      shape.block_cols, expected.data());
      DeviceBuffer<float> d_x(x), d_out(nan_vector(x.size()));
      cuda::fake_quantize_fp_blockwise(d_x.get(), d_out.get(), rows, cols, format, shape.block_rows,
                                       shape.block_cols, nullptr);
      // In place, as the model's fp8mix path runs it.
      cuda::fake_quantize_fp_blockwise(d_x.get(), d_x.get(), rows, cols, format, shape.block_rows,
                                       shape.block_cols, nullptr);
      sync();
      expect_same_bits(d_out.to_host(), expected, "out");
      expect_same_bits(d_x.to_host(), expected, "in place");
    }
  }
}

TEST(GpuTrainOps, RoundToBf16IsBitExact) {
  SKIP_WITHOUT_GPU();
  std::vector<float> x = random_vector(1001, 20, 100.0f);
  x[0] = kNaN;
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = 3.0e38f;      // rounds to +inf
  x[3] = 1.00390625f;  // a tie: 1 + 2^-8 rounds to even (1)
  x[4] = 1.01171875f;  // a tie that rounds up
  x[5] = 1e-40f;       // subnormal
  std::vector<float> expected(x.size());
  cpu::round_to_bf16_copy(x.data(), expected.data(), int64_t(x.size()), 2);
  DeviceBuffer<float> d_x(x), d_out(nan_vector(x.size()));
  cuda::round_to_bf16(d_x.get(), d_out.get(), int64_t(x.size()), nullptr);
  cuda::round_to_bf16(d_x.get(), d_x.get(), int64_t(x.size()), nullptr);  // in place
  sync();
  expect_same_bits(d_out.to_host(), expected, "out");
  expect_same_bits(d_x.to_host(), expected, "in place");
}

TEST(GpuTrainOps, EmptyInputsLaunchNothing) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<float> buffer(1);
  cuda::swiglu_forward(buffer.get(), buffer.get(), buffer.get(), 0, nullptr);
  cuda::round_to_bf16(buffer.get(), buffer.get(), 0, nullptr);
  cuda::rmsnorm_forward(buffer.get(), buffer.get(), 1e-5f, buffer.get(), buffer.get(), 0, 8,
                        nullptr);
  cuda::cross_entropy_forward(buffer.get(), nullptr, buffer.get(), 0, 8, nullptr);
  cuda::fake_quantize_fp_blockwise(buffer.get(), buffer.get(), 0, 8, FpFormat::kE4M3, 1, 128,
                                   nullptr);
  sync();
}

}  // namespace
}  // namespace gnmr
