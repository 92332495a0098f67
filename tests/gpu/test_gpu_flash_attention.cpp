// The flash-attention kernels (kernels/flash_attention.cu) against their CPU twin
// cpu::flash_attention_forward / backward (src/backend/cpu/flash_attention.cpp, run on the same
// 64 x 64 tiling) and against the materialised CPU attention cpu::attention_forward /
// attention_backward<float>: out, lse, dq, dk, dv for T in {1, 17, 128, 1000} (1000 ends in a
// partial tile of 40 rows), GQA (H = 8, Hkv = 2) and H = Hkv, hd 64 and 128; bit determinism
// over two runs; outputs poisoned with NaN before the call fully overwritten; an unsupported
// head dim refused with the shape in the message. The tensor-core forward and backward
// (kernels/flash_attention_mma.cu) against the double-precision reference of the bf16-rounded
// inputs and its gradients (tests/backend/attention_bf16_reference.h, which derives the
// bounds), on the same shapes, and the same bits twice.
// Skip without a GPU (except the refusal, which is decided on the host).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../backend/attention_bf16_reference.h"
#include "backend/cpu/flash_attention.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/flash_layout.h"
#include "backend/rope_table.h"
#include "gpu_test_util.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "test_paths.h"
#include "train/wgmma_trial.h"
#include "util/error.h"

#ifdef GNMR_CUDA_EMULATED
#include "emulated_cuda/emulated_cuda.h"
#endif

namespace gnmr::cuda {
namespace {

using gnmr_test::DeviceBuffer;

constexpr double kUnitRoundoff = 1.0 / (1 << 24);  // fp32: 2^-24
constexpr int kCpuThreads = 8;

using gnmr_test::count_non_finite;
using gnmr_test::poison;
using gnmr_test::random_normal;
using gnmr_test::relative_error;

struct Inputs {
  std::vector<float> q, k, v, dout;
  explicit Inputs(const AttentionShape& s) {
    const size_t nq = size_t(s.batch * s.seq * s.heads * s.head_dim);
    const size_t nkv = size_t(s.batch * s.seq * s.kv_heads * s.head_dim);
    q = random_normal(nq, 31), k = random_normal(nkv, 32), v = random_normal(nkv, 33);
    dout = random_normal(nq, 34);
    // A spread of scores (|q.k| / sqrt(hd) up to ~6) that makes the running max move across
    // key tiles, so the online rescaling is exercised.
    for (float& x : q) x *= 2.0f;
  }
};

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result run_gpu(const Inputs& in, const AttentionShape& s) {
  const size_t nq = in.q.size(), nkv = in.k.size(), nrows = size_t(s.batch * s.heads * s.seq);
  const size_t scratch_floats =
      size_t(flash_attention_backward_scratch_floats(s.batch, s.seq, s.heads));
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), dout(in.dout);
  DeviceBuffer<float> out(nq), lse(nrows), dq(nq), dk(nkv), dv(nkv), scratch(scratch_floats);
  poison(out, nq), poison(lse, nrows), poison(dq, nq), poison(dk, nkv), poison(dv, nkv);
  poison(scratch, scratch_floats);
  flash_attention_forward(q.get(), k.get(), v.get(), out.get(), lse.get(), s.batch, s.seq, s.heads,
                          s.kv_heads, s.head_dim, nullptr);
  flash_attention_backward(q.get(), k.get(), v.get(), out.get(), lse.get(), dout.get(), dq.get(),
                           dk.get(), dv.get(), scratch.get(), s.batch, s.seq, s.heads, s.kv_heads,
                           s.head_dim, nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  return {out.to_host(), lse.to_host(), dq.to_host(), dk.to_host(), dv.to_host()};
}

Result run_cpu_twin(const Inputs& in, const AttentionShape& s) {
  Result r;
  r.out.resize(in.q.size()), r.dq.resize(in.q.size());
  r.dk.resize(in.k.size()), r.dv.resize(in.k.size());
  r.lse.resize(size_t(s.batch * s.heads * s.seq));
  const FlashTiling tiles = flash_gpu_tiling(s.seq);
  cpu::flash_attention_forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), s,
                               tiles, kCpuThreads);
  cpu::flash_attention_backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(),
                                in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(), s, tiles,
                                kCpuThreads);
  return r;
}

Result run_cpu_materialized(const Inputs& in, const AttentionShape& s) {
  Result r;
  r.out.resize(in.q.size()), r.dq.resize(in.q.size());
  r.dk.resize(in.k.size()), r.dv.resize(in.k.size());
  std::vector<float> probs(size_t(s.batch * s.heads * s.seq * s.seq));
  cpu::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), r.out.data(), probs.data(),
                                s, kCpuThreads);
  std::vector<float> workspace(size_t(cpu::attention_backward_workspace(s, kCpuThreads)));
  cpu::attention_backward<float>(in.q.data(), in.k.data(), in.v.data(), probs.data(),
                                 in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(), s,
                                 workspace.data(), kCpuThreads);
  return r;
}

// GQA (H = 8, Hkv = 2) and H = Hkv for each T and head dim.
std::vector<AttentionShape> shapes_for(std::initializer_list<int64_t> seqs, int64_t batch) {
  std::vector<AttentionShape> all;
  for (int64_t t : seqs) {
    for (int64_t hd : {64, 128}) {
      all.push_back({batch, t, 8, 2, hd});
      all.push_back({batch, t, 4, 4, hd});
    }
  }
  return all;
}

// Worst-case fp32 bound on the relative (Frobenius) difference of two computations of the
// forward over the same inputs: an inner product of length K in fp32 is off by at most
// ~K u |a||b| in any summation order and with any few-ulp exp (u = 2^-24), so two of them
// differ by at most 2 K u in the norm; K is at most max(T, hd) (scores over hd, P v over T).
// The backward chains dP (hd terms), the softmax backward and dq / dk / dv (T terms; dk and dv
// over every head of the GQA group, T * H / Hkv terms), so it gets 3x that bound with K the
// longest of these sums. Against the twin the
// order of every sum is the same and only CUDA's expf / logf (<= 2 ulp, CUDA Programming Guide
// appendix "Mathematical Functions") round differently, so the real difference is far below
// the bound; against the materialised attention the orders differ too. An index, mask or
// tile error changes whole rows by O(1) relative, far above the bound.
double forward_tolerance(const AttentionShape& s) {
  return 2.0 * double(std::max(s.seq, s.head_dim)) * kUnitRoundoff;
}
double backward_tolerance(const AttentionShape& s) {
  const int64_t longest_sum = std::max(s.seq * (s.heads / s.kv_heads), s.head_dim);
  return 3.0 * 2.0 * double(longest_sum) * kUnitRoundoff;
}

void expect_matches_the_cpu(const std::vector<AttentionShape>& all) {
  for (const AttentionShape& s : all) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    const Result gpu = run_gpu(in, s);
    // Poisoned with NaN before the call: any element left unwritten is still NaN.
    for (const auto* x : {&gpu.out, &gpu.lse, &gpu.dq, &gpu.dk, &gpu.dv}) {
      ASSERT_EQ(count_non_finite(*x), 0u);
    }
    const double forward_tol = forward_tolerance(s), backward_tol = backward_tolerance(s);
    const Result twin = run_cpu_twin(in, s);
    EXPECT_LE(relative_error(gpu.out, twin.out), forward_tol) << "out vs twin";
    EXPECT_LE(relative_error(gpu.dq, twin.dq), backward_tol) << "dq vs twin";
    EXPECT_LE(relative_error(gpu.dk, twin.dk), backward_tol) << "dk vs twin";
    EXPECT_LE(relative_error(gpu.dv, twin.dv), backward_tol) << "dv vs twin";
    // lse = m + log(l): l is a sum of at most T exps (relative error <= 2 T u between two
    // computations, hence that much absolute in its log), m + log(l) adds a rounding of each
    // side's |lse| and logf's own 2 ulp.
    for (size_t r = 0; r < gpu.lse.size(); ++r) {
      const double bound = 2.0 * double(s.seq) * kUnitRoundoff +
                           8.0 * kUnitRoundoff * std::abs(double(twin.lse[r])) + 1e-30;
      ASSERT_NEAR(gpu.lse[r], twin.lse[r], bound) << "lse row " << r;
    }
    const Result materialized = run_cpu_materialized(in, s);
    EXPECT_LE(relative_error(gpu.out, materialized.out), forward_tol) << "out vs materialized";
    EXPECT_LE(relative_error(gpu.dq, materialized.dq), backward_tol) << "dq vs materialized";
    EXPECT_LE(relative_error(gpu.dk, materialized.dk), backward_tol) << "dk vs materialized";
    EXPECT_LE(relative_error(gpu.dv, materialized.dv), backward_tol) << "dv vs materialized";
  }
}

TEST(GpuFlashAttention, MatchesTheCpuTwinAndTheMaterializedAttentionAndOverwritesEveryOutput) {
  SKIP_WITHOUT_GPU();
  expect_matches_the_cpu(shapes_for({1, 17, 128}, 2));
}

// 1000 = 15 full tiles and one of 40 rows; B = 1 keeps the CPU references to seconds.
TEST(GpuFlashAttention, MatchesTheCpuAtALongSequenceWithAPartialLastTile) {
  SKIP_WITHOUT_GPU();
  expect_matches_the_cpu(shapes_for({1000}, 1));
}

TEST(GpuFlashAttention, GivesTheSameBitsOnEveryRun) {
  SKIP_WITHOUT_GPU();
  for (const AttentionShape& s :
       {AttentionShape{2, 200, 8, 2, 64}, AttentionShape{1, 1000, 8, 2, 128}}) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    const Result first = run_gpu(in, s);
    const Result second = run_gpu(in, s);
    const std::vector<const std::vector<float>*> a = {&first.out, &first.lse, &first.dq, &first.dk,
                                                      &first.dv};
    const std::vector<const std::vector<float>*> b = {&second.out, &second.lse, &second.dq,
                                                      &second.dk, &second.dv};
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i]->size(), b[i]->size());
      EXPECT_EQ(std::memcmp(a[i]->data(), b[i]->data(), a[i]->size() * sizeof(float)), 0)
          << "output " << i << " (out, lse, dq, dk, dv)";
    }
  }
}

// forward_tile, dq_tile: the forward's and the dq pass's query tiles (flash_attention_*_mma).
Result run_gpu_mma(const Inputs& in, const AttentionShape& s, int64_t forward_tile,
                   int64_t dq_tile) {
  const size_t nq = in.q.size(), nkv = in.k.size(), nrows = size_t(s.batch * s.heads * s.seq);
  const size_t inputs_floats =
      size_t(flash_attention_mma_inputs_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim) / 4);
  const size_t scratch_floats = size_t(
      flash_attention_mma_scratch_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim) / 4);
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), dout(in.dout);
  DeviceBuffer<float> out(nq), lse(nrows), dq(nq), dk(nkv), dv(nkv), inputs(inputs_floats),
      scratch(scratch_floats);
  poison(out, nq), poison(lse, nrows), poison(dq, nq), poison(dk, nkv), poison(dv, nkv);
  // The bf16 copies and delta: every byte read is written first.
  poison(inputs, inputs_floats), poison(scratch, scratch_floats);
  flash_attention_forward_mma(q.get(), k.get(), v.get(), nullptr, nullptr, out.get(), lse.get(),
                              inputs.get(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                              nullptr, forward_tile);
  // The backward reads the forward's copies, not q, k, v: the caller may reuse them.
  poison(q, nq), poison(k, nkv), poison(v, nkv);
  flash_attention_backward_mma(inputs.get(), out.get(), lse.get(), dout.get(), dq.get(), dk.get(),
                               dv.get(), scratch.get(), s.batch, s.seq, s.heads, s.kv_heads,
                               s.head_dim, nullptr, dq_tile);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  return {out.to_host(), lse.to_host(), dq.to_host(), dk.to_host(), dv.to_host()};
}

void expect_tensor_core_kernels_within_the_bounds(const std::vector<AttentionShape>& all) {
  namespace ref = attention_bf16_reference;
  for (const AttentionShape& s : all) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    const int64_t dq_tile = flash_mma_query_pass_tile(s.head_dim);
    const Result first = run_gpu_mma(in, s, kFlashMmaForwardQueryTile, dq_tile);
    for (const auto* x : {&first.out, &first.lse, &first.dq, &first.dk, &first.dv}) {
      ASSERT_EQ(count_non_finite(*x), 0u);
    }
    const ref::Reference forward = ref::reference(in.q, in.k, in.v, s);
    EXPECT_EQ(ref::out_violations(first.out, forward), "");
    EXPECT_EQ(ref::lse_violations(first.lse, forward), "");
    const ref::Gradients grads = ref::backward_reference(in.q, in.k, in.v, in.dout, s);
    EXPECT_EQ(ref::violations("dq", first.dq, grads.dq, grads.dq_bound), "");
    EXPECT_EQ(ref::violations("dk", first.dk, grads.dk, grads.dk_bound), "");
    EXPECT_EQ(ref::violations("dv", first.dv, grads.dv, grads.dv_bound), "");
    // The same bits on a second run, and from the other query tiles (the forward's, and at hd
    // 64 the dq pass's): each row's scores, maxima, sums and products take the same key tiles
    // in the same order in both (the 128-row tile's first half skips the key tile past its
    // queries).
    const int64_t other_tile = kFlashMmaForwardQueryTile == 128 ? 64 : 128;
    const int64_t other_dq_tile = s.head_dim == 64 && dq_tile == 64 ? 128 : 64;
    const Result second = run_gpu_mma(in, s, kFlashMmaForwardQueryTile, dq_tile);
    const Result other = run_gpu_mma(in, s, other_tile, other_dq_tile);
    const std::vector<const std::vector<float>*> a = {&first.out, &first.lse, &first.dq, &first.dk,
                                                      &first.dv};
    const std::vector<const std::vector<float>*> b = {&second.out, &second.lse, &second.dq,
                                                      &second.dk, &second.dv};
    const std::vector<const std::vector<float>*> c = {&other.out, &other.lse, &other.dq, &other.dk,
                                                      &other.dv};
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(std::memcmp(a[i]->data(), b[i]->data(), a[i]->size() * sizeof(float)), 0)
          << "output " << i << " (out, lse, dq, dk, dv) differs between two runs";
      EXPECT_EQ(std::memcmp(a[i]->data(), c[i]->data(), a[i]->size() * sizeof(float)), 0)
          << "output " << i << " (out, lse, dq, dk, dv) differs with query tiles of " << other_tile
          << " rows in the forward and " << other_dq_tile << " in the dq pass";
    }
  }
}

TEST(GpuFlashAttention, TensorCoreKernelsAreWithinTheBf16BoundsAndGiveTheSameBitsTwice) {
  SKIP_WITHOUT_GPU();
  expect_tensor_core_kernels_within_the_bounds(shapes_for({1, 17, 128}, 2));
}

// Named *LongSequence* so gpu_check.sh's memcheck stage leaves it out (its double-precision
// reference takes seconds per shape).
TEST(GpuFlashAttention, TensorCoreKernelsAtALongSequenceWithAPartialLastTile) {
  SKIP_WITHOUT_GPU();
  expect_tensor_core_kernels_within_the_bounds(shapes_for({1000}, 1));
}

// Runs `run` (which writes `outputs`, NaN-poisoned first) twice; both runs' outputs must be
// finite and give the same bits. Returns the first's.
std::vector<std::vector<float>> twice_the_same(std::vector<DeviceBuffer<float>*> outputs,
                                               const std::vector<size_t>& counts,
                                               const std::function<void()>& run) {
  std::vector<std::vector<float>> first;
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (size_t i = 0; i < outputs.size(); ++i) poison(*outputs[i], counts[i]);
    run();
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::vector<float> got = outputs[i]->to_host();
      EXPECT_EQ(count_non_finite(got), 0u) << "output " << i;
      if (attempt == 0) {
        first.push_back(got);
      } else {
        EXPECT_EQ(std::memcmp(got.data(), first[i].data(), got.size() * sizeof(float)), 0)
            << "output " << i << " differs between two runs";
      }
    }
  }
  return first;
}

// The wgmma kernels (sm_90a; kernels/flash_attention_mma.cu: flash_forward_wgmma_kernel,
// flash_backward_query_wgmma_kernel, flash_backward_key_value_wgmma_kernel) on the bf16 copies,
// delta and dout copy the mma.sync forward and backward made, at each query tile they take:
// out, lse, dq, dk and dv within the bounds of the reference, every output written
// (NaN-poisoned before), the same bits twice; and whether they give the mma.sync kernels' bits,
// said in the log (the emulation gives them; on a GPU that is the hardware's summation order,
// which no document fixes). Skips where they do not run.
void expect_wgmma_kernels_within_the_bounds(const std::vector<AttentionShape>& all) {
  namespace ref = attention_bf16_reference;
  SKIP_WITHOUT_WGMMA();
  for (const AttentionShape& s : all) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    const size_t nq = in.q.size(), nkv = in.k.size(), nrows = size_t(s.batch * s.heads * s.seq);
    const size_t inputs_floats = size_t(
        flash_attention_mma_inputs_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim) / 4);
    const size_t scratch_floats = size_t(
        flash_attention_mma_scratch_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim) / 4);
    DeviceBuffer<float> q(in.q), k(in.k), v(in.v), dout(in.dout);
    DeviceBuffer<float> out(nq), lse(nrows), dq(nq), dk(nkv), dv(nkv), inputs(inputs_floats),
        scratch(scratch_floats);
    poison(inputs, inputs_floats), poison(scratch, scratch_floats);
    flash_attention_forward_mma(q.get(), k.get(), v.get(), nullptr, nullptr, out.get(), lse.get(),
                                inputs.get(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                                nullptr, kFlashQTile);
    flash_attention_backward_mma(inputs.get(), out.get(), lse.get(), dout.get(), dq.get(), dk.get(),
                                 dv.get(), scratch.get(), s.batch, s.seq, s.heads, s.kv_heads,
                                 s.head_dim, nullptr, kFlashQTile);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> mma_out = out.to_host(), mma_lse = lse.to_host(),
                             mma_dq = dq.to_host(), mma_dk = dk.to_host(), mma_dv = dv.to_host();
    const ref::Reference forward = ref::reference(in.q, in.k, in.v, s);
    const ref::Gradients grads = ref::backward_reference(in.q, in.k, in.v, in.dout, s);
    const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0 ? "same" : "differs";
    };
    const std::vector<std::vector<float>> kv = twice_the_same({&dk, &dv}, {nkv, nkv}, [&] {
      flash_key_value_pass_mma_only(inputs.get(), lse.get(), scratch.get(), dk.get(), dv.get(),
                                    s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, nullptr,
                                    FlashMmaInstruction::Wgmma);
    });
    EXPECT_EQ(ref::violations("dk", kv[0], grads.dk, grads.dk_bound), "");
    EXPECT_EQ(ref::violations("dv", kv[1], grads.dv, grads.dv_bound), "");
    std::printf("wgmma dk/dv pass, %s: dk %s, dv %s as mma.sync's\n",
                attention_shape_text(s).c_str(), same_bits(kv[0], mma_dk),
                same_bits(kv[1], mma_dv));
    for (const int64_t tile : {kFlashQTile, 2 * kFlashQTile}) {
      SCOPED_TRACE("query tiles of " + std::to_string(tile) + " rows");
      // The wgmma forward writes an lse of its own: the dq pass reads the mma.sync forward's,
      // as the backward that made its delta did.
      DeviceBuffer<float> wgmma_lse(nrows);
      const std::vector<std::vector<float>> fwd =
          twice_the_same({&out, &wgmma_lse}, {nq, nrows}, [&] {
            flash_forward_mma_kernel_only(inputs.get(), out.get(), wgmma_lse.get(), s.batch, s.seq,
                                          s.heads, s.kv_heads, s.head_dim, nullptr, tile,
                                          FlashMmaInstruction::Wgmma);
          });
      EXPECT_EQ(ref::out_violations(fwd[0], forward), "");
      EXPECT_EQ(ref::lse_violations(fwd[1], forward), "");
      std::printf("wgmma forward, %s, %lld-row tiles: out %s, lse %s as mma.sync's\n",
                  attention_shape_text(s).c_str(), (long long)tile, same_bits(fwd[0], mma_out),
                  same_bits(fwd[1], mma_lse));
      if (tile == 2 * kFlashQTile && s.head_dim != 64) continue;  // dq: 128 rows at hd 64 only
      const std::vector<std::vector<float>> bwd = twice_the_same({&dq}, {nq}, [&] {
        flash_dq_pass_mma_only(inputs.get(), lse.get(), scratch.get(), dq.get(), s.batch, s.seq,
                               s.heads, s.kv_heads, s.head_dim, nullptr, tile,
                               FlashMmaInstruction::Wgmma);
      });
      EXPECT_EQ(ref::violations("dq", bwd[0], grads.dq, grads.dq_bound), "");
      std::printf("wgmma dq pass, %s, %lld-row tiles: dq %s as mma.sync's\n",
                  attention_shape_text(s).c_str(), (long long)tile, same_bits(bwd[0], mma_dq));
    }
  }
}

TEST(GpuFlashAttention, WgmmaKernelsAreWithinTheBf16BoundsAndGiveTheSameBitsTwice) {
  SKIP_WITHOUT_GPU();
  expect_wgmma_kernels_within_the_bounds(shapes_for({1, 17, 128}, 2));
}

// Named *LongSequence*: gpu_check.sh's memcheck stage leaves it out.
TEST(GpuFlashAttention, WgmmaKernelsAtALongSequenceWithAPartialLastTile) {
  SKIP_WITHOUT_GPU();
  expect_wgmma_kernels_within_the_bounds(shapes_for({1000}, 1));
}

// dq, dk, dv of two runs through the backend: the same bits, and finite.
void expect_same_finite_gradients(const std::vector<float> (&a)[3],
                                  const std::vector<float> (&b)[3]) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << "gradient " << i;
    EXPECT_TRUE(std::all_of(b[i].begin(), b[i].end(), [](float g) { return std::isfinite(g); }))
        << "gradient " << i;
  }
}

// Through the backend: a state planned with out_kept reads the caller's out in the backward
// instead of a copy, saves out's bytes less, and gives the same bits as one that keeps the
// copy, whose backward must not read the caller's out (poisoned after the forward).
TEST(GpuFlashAttention, TheBackendReadsTheCallersOutWhenItIsKeptAndItsCopyOtherwise) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions options;
  options.attention = CudaAttention::Flash;
  std::unique_ptr<Backend> be = make_cuda_backend(options);
  const AttentionShape shape{2, 130, 8, 2, 64};
  const int64_t b = shape.batch, t = shape.seq, h = shape.heads, hkv = shape.kv_heads,
                hd = shape.head_dim;
  auto upload = [&](const char* name, std::vector<int64_t> dims, uint32_t seed) {
    Tensor x = be->allocate(name, dims, DType::F32, MemoryRole::Scratch);
    const std::vector<float> values = gnmr_test::random_normal(size_t(x.numel()), seed);
    be->copy_from_host(x, values.data());
    return x;
  };
  const Tensor q = upload("q", {b, t, h, hd}, 1), k = upload("k", {b, t, hkv, hd}, 2),
               v = upload("v", {b, t, hkv, hd}, 3), dout = upload("dout", {b, t, h, hd}, 4);
  std::vector<float> grads[2][3];
  size_t saved[2] = {0, 0};
  for (int kept = 0; kept < 2; ++kept) {
    std::unique_ptr<AttentionState> state = be->plan_attention("attention", shape, kept == 1);
    saved[kept] = state->saved_bytes();
    Tensor out = be->allocate("out", {b, t, h, hd}, DType::F32, MemoryRole::Scratch);
    Tensor dq = be->allocate("dq", {b, t, h, hd}, DType::F32, MemoryRole::Scratch);
    Tensor dk = be->allocate("dk", {b, t, hkv, hd}, DType::F32, MemoryRole::Scratch);
    Tensor dv = be->allocate("dv", {b, t, hkv, hd}, DType::F32, MemoryRole::Scratch);
    be->attention_forward(q, k, v, out, *state);
    if (kept == 0) {
      const std::vector<float> nan(size_t(out.numel()), std::nanf(""));
      be->copy_from_host(out, nan.data());  // the copy must be what the backward reads
    }
    be->attention_backward(q, k, v, *state, dout, dq, dk, dv);
    Tensor* outs[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 3; ++i) {
      grads[kept][i].resize(size_t(outs[i]->numel()));
      be->copy_to_host(*outs[i], grads[kept][i].data());
    }
  }
  EXPECT_EQ(saved[0] - saved[1], size_t(b * t * h * hd) * sizeof(float));
  expect_same_finite_gradients(grads[0], grads[1]);
}

// Through the backend: the tensor-core kernels' state keeps the forward's bf16 copies of q, k, v
// (keeps_inputs, their bytes in saved_bytes), so a backward after q, k, v were overwritten gives
// the bits of one after they were not; the other kernels read the q, k, v passed to them.
TEST(GpuFlashAttention, TheTensorCoreStateKeepsItsBf16InputsSoTheBackwardReadsNoQKV) {
  SKIP_WITHOUT_GPU();
  const AttentionShape shape{2, 130, 8, 2, 64};
  const int64_t b = shape.batch, t = shape.seq, h = shape.heads, hkv = shape.kv_heads,
                hd = shape.head_dim;
  for (CudaAttention kernel :
       {CudaAttention::FlashBf16, CudaAttention::Flash, CudaAttention::Materialized}) {
    CudaBackendOptions options;
    options.attention = kernel;
    std::unique_ptr<Backend> be = make_cuda_backend(options);
    std::unique_ptr<AttentionState> state = be->plan_attention("attention", shape, false);
    SCOPED_TRACE(state->kernel());
    const bool keeps = kernel == CudaAttention::FlashBf16;
    EXPECT_EQ(state->keeps_inputs(), keeps);
    if (!keeps) continue;
    const size_t out_and_lse = size_t(b * t * h * hd + b * h * t) * sizeof(float);
    EXPECT_EQ(state->saved_bytes(),
              out_and_lse + size_t(flash_attention_mma_inputs_bytes(b, t, h, hkv, hd)));
    auto tensor = [&](const char* name, std::vector<int64_t> dims) {
      return be->allocate(name, std::move(dims), DType::F32, MemoryRole::Scratch);
    };
    auto fill = [&](Tensor& x, uint32_t seed) {
      const std::vector<float> values = gnmr_test::random_normal(size_t(x.numel()), seed);
      be->copy_from_host(x, values.data());
    };
    Tensor q = tensor("q", {b, t, h, hd}), k = tensor("k", {b, t, hkv, hd}),
           v = tensor("v", {b, t, hkv, hd}), dout = tensor("dout", {b, t, h, hd});
    fill(dout, 4);
    std::vector<float> grads[2][3];
    for (int overwritten = 0; overwritten < 2; ++overwritten) {
      fill(q, 1), fill(k, 2), fill(v, 3);
      Tensor out = tensor("out", {b, t, h, hd}), dq = tensor("dq", {b, t, h, hd}),
             dk = tensor("dk", {b, t, hkv, hd}), dv = tensor("dv", {b, t, hkv, hd});
      be->attention_forward(q, k, v, out, *state);
      if (overwritten == 1) {
        for (Tensor* x : {&q, &k, &v}) {
          const std::vector<float> nan(size_t(x->numel()), std::nanf(""));
          be->copy_from_host(*x, nan.data());
        }
      }
      be->attention_backward(q, k, v, *state, dout, dq, dk, dv);
      Tensor* outs[3] = {&dq, &dk, &dv};
      for (int i = 0; i < 3; ++i) {
        grads[overwritten][i].resize(size_t(outs[i]->numel()));
        be->copy_to_host(*outs[i], grads[overwritten][i].data());
      }
    }
    expect_same_finite_gradients(grads[0], grads[1]);
  }
}

// Two forward and backward calls through a cuda backend made with `options` (bf16 GEMMs) at
// `shape`, on random inputs fixed by the shape: each call's out, dq, dk, dv, the host's waits
// during each call's forward and backward, the state's kernel() and what the backend logged.
struct BackendAttentionCalls {
  std::vector<float> results[2][4];       // [call][out, dq, dk, dv]
  int64_t waits[2][2];                    // [call][forward, backward]
  std::string kernel, kernel_after, log;  // kernel(): at the plan, after the calls
};

BackendAttentionCalls backend_attention_calls(const CudaBackendOptions& options,
                                              const AttentionShape& shape) {
  const int64_t b = shape.batch, t = shape.seq, h = shape.heads, hkv = shape.kv_heads,
                hd = shape.head_dim;
  gnmr_test::CapturedLog log;
  BackendAttentionCalls calls;
  std::unique_ptr<Backend> be = make_cuda_backend(options);
  be->set_gemm_precision(GemmPrecision::BF16);
  std::unique_ptr<AttentionState> state = be->plan_attention("attention", shape, false);
  calls.kernel = state->kernel();
  auto tensor = [&](const char* name, std::vector<int64_t> dims, uint32_t seed) {
    Tensor x = be->allocate(name, std::move(dims), DType::F32, MemoryRole::Scratch);
    const std::vector<float> values = gnmr_test::random_normal(size_t(x.numel()), seed);
    be->copy_from_host(x, values.data());
    return x;
  };
  const Tensor q = tensor("q", {b, t, h, hd}, 1), k = tensor("k", {b, t, hkv, hd}, 2),
               v = tensor("v", {b, t, hkv, hd}, 3), dout = tensor("dout", {b, t, h, hd}, 4);
  for (int call = 0; call < 2; ++call) {
    Tensor out = tensor("out", {b, t, h, hd}, 5), dq = tensor("dq", {b, t, h, hd}, 6),
           dk = tensor("dk", {b, t, hkv, hd}, 7), dv = tensor("dv", {b, t, hkv, hd}, 8);
    const int64_t before = be->sync_count();
    be->attention_forward(q, k, v, out, *state);
    calls.waits[call][0] = be->sync_count() - before;
    be->attention_backward(q, k, v, *state, dout, dq, dk, dv);
    calls.waits[call][1] = be->sync_count() - before - calls.waits[call][0];
    Tensor* outs[4] = {&out, &dq, &dk, &dv};
    for (int i = 0; i < 4; ++i) {
      calls.results[call][i].resize(size_t(outs[i]->numel()));
      be->copy_to_host(*outs[i], calls.results[call][i].data());
    }
  }
  calls.log = log.text();
  calls.kernel_after = state->kernel();
  return calls;
}

// check(shape, defaults) at each head dim's shape, a partial 128-row query tile and two query
// heads a kv head at one sequence and four heads (the timing runs each kernel ~16 times, seconds
// each on the CUDA emulation), with the calls on the mma.sync kernels at their default tiles:
// the bits every variant must give.
void for_each_timed_shape(
    const std::function<void(const AttentionShape&, const BackendAttentionCalls&)>& check) {
  for (const int64_t hd : {int64_t{64}, int64_t{128}}) {
    const AttentionShape shape{1, 130, 4, 2, hd};
    SCOPED_TRACE("hd " + std::to_string(hd));
    CudaBackendOptions options;
    options.attention = CudaAttention::FlashBf16;
    options.flash_tiles = FlashTiles::Defaults;
    const BackendAttentionCalls defaults = backend_attention_calls(options, shape);
    EXPECT_EQ(defaults.kernel.find("timed at its first forward"), std::string::npos);
    EXPECT_EQ(defaults.waits[0][0] + defaults.waits[0][1], 0) << "nothing timed";
    check(shape, defaults);
  }
}

// What the backend logged of `pass`'s choice ("the forward", "the backward"): the variant
// ("wgmma, 128-row query tiles") and its whole line from there, with the times of the others;
// both "" where it logged none.
struct LoggedChoice {
  std::string variant, line;
};

LoggedChoice logged_choice(const std::string& log, const std::string& pass) {
  const std::string runs = pass + " runs ";
  const size_t at = log.find(runs);
  if (at == std::string::npos) return {};
  const std::string line = log.substr(at, log.find('\n', at) - at);
  return {line.substr(runs.size(), line.find(" (") - runs.size()), line};
}

// Both calls' out, dq, dk, dv of `got` have the bits of `want`'s.
void expect_same_call_bits(const BackendAttentionCalls& got, const BackendAttentionCalls& want) {
  for (int call = 0; call < 2; ++call) {
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE("call " + std::to_string(call) + ", result " + std::to_string(i));
      ASSERT_EQ(got.results[call][i].size(), want.results[call][i].size());
      EXPECT_EQ(std::memcmp(got.results[call][i].data(), want.results[call][i].data(),
                            want.results[call][i].size() * sizeof(float)),
                0);
    }
  }
}

// Through the backend: with the query tiles timed (FlashTiles::Timed), a shape's first forward
// and, at head dim 64, its first backward time both tiles (one more wait each, none after),
// and every call gives the bits of the default tiles: out, dq, dk, dv, the first call and the
// second (which runs the tile the timing chose).
TEST(GpuFlashAttention, TimedQueryTilesWaitOnceAndGiveTheDefaultTilesBits) {
  SKIP_WITHOUT_GPU();
  for_each_timed_shape([](const AttentionShape& shape, const BackendAttentionCalls& defaults) {
    const int64_t hd = shape.head_dim;
    CudaBackendOptions options;
    options.attention = CudaAttention::FlashBf16;
    options.flash_tiles = FlashTiles::Timed;
    const BackendAttentionCalls timed = backend_attention_calls(options, shape);
    EXPECT_NE(timed.kernel.find("timed at its first forward"), std::string::npos);
    EXPECT_EQ(timed.kernel.find("chosen:"), std::string::npos) << timed.kernel;
    // After the calls it names what each pass chose, as the log did (the backward at head dim
    // 128 had one variant: nothing timed, nothing logged).
    for (const char* pass : {"the forward", "the backward"}) {
      SCOPED_TRACE(pass);
      const LoggedChoice logged = logged_choice(timed.log, pass);
      const std::string variant =
          logged.line.empty() && hd == 128 ? "mma.sync, 64-row query tiles" : logged.variant;
      ASSERT_FALSE(variant.empty()) << timed.log;
      EXPECT_NE(timed.kernel_after.find(std::string(pass) + " on " + variant), std::string::npos)
          << timed.kernel_after << "\n"
          << timed.log;
    }
    EXPECT_EQ(timed.waits[0][0], 1) << "the forward's tiles timed at the first call";
    EXPECT_EQ(timed.waits[0][1], hd == 64 ? 1 : 0) << "the dq pass's, at head dim 64";
    EXPECT_EQ(timed.waits[1][0] + timed.waits[1][1], 0) << "no timing at the second call";
    EXPECT_NE(timed.log.find("the forward runs mma.sync"), std::string::npos) << timed.log;
    EXPECT_EQ(timed.log.find("wgmma"), std::string::npos) << "flash_bf16 offers mma.sync alone";
    expect_same_call_bits(timed, defaults);
  });
}

// model.attention auto with the variants timed and a wgmma trial that passes (as
// GNMR_AUTO_WGMMA=1's), on a device that runs wgmma: a shape's first forward and backward run
// the wgmma kernels beside the mma.sync ones and offer them to the timing only where they left
// the same bits (bits_digest.h), so every call, the first and the one after the choice, gives
// the mma.sync kernels' bits. Without a trial, auto offers mma.sync alone. On the emulation, whose
// wgmma sums as its mma.sync does, a second run makes the emulated wgmma round toward zero: its
// bits differ, the log says so for each pass, and only mma.sync is timed.
TEST(GpuFlashAttention, AutoOffersTheWgmmaKernelsOnlyWhereTheyGiveTheMmaSyncKernelsBits) {
  SKIP_WITHOUT_WGMMA();
  for_each_timed_shape([](const AttentionShape& shape, const BackendAttentionCalls& mma_sync) {
    const int64_t hd = shape.head_dim;
    CudaBackendOptions options;
    options.attention = CudaAttention::Auto;
    options.flash_tiles = FlashTiles::Timed;
    if (hd == 64) {
      const BackendAttentionCalls unasked = backend_attention_calls(options, shape);
      EXPECT_EQ(unasked.kernel.find("wgmma"), std::string::npos) << unasked.kernel;
      EXPECT_EQ(unasked.log.find("wgmma"), std::string::npos) << unasked.log;
      expect_same_call_bits(unasked, mma_sync);
    }
    options.wgmma_trial = [](const AttentionShape&) { return std::string(); };
    const BackendAttentionCalls chosen = backend_attention_calls(options, shape);
    EXPECT_NE(chosen.kernel.find("or wgmma where it gives mma.sync's bits"), std::string::npos)
        << chosen.kernel;
    EXPECT_GT(chosen.waits[0][0], 0);
    EXPECT_GT(chosen.waits[0][1], 0) << "wgmma offered: the backward chooses at every head dim";
    EXPECT_EQ(chosen.waits[1][0] + chosen.waits[1][1], 0) << "nothing chosen at the second call";
    expect_same_call_bits(chosen, mma_sync);
    EXPECT_NE(chosen.kernel_after.find("; chosen: the forward on "), std::string::npos)
        << chosen.kernel_after;
    EXPECT_NE(chosen.kernel_after.find(", the backward on "), std::string::npos)
        << chosen.kernel_after;
    // The GPU's answer, for the run's log (gpu_check.sh prints it).
    const bool same_bits = chosen.log.find("wrote other bits") == std::string::npos;
    std::printf("auto flash attention, hd %lld: the wgmma kernels %s\n", static_cast<long long>(hd),
                same_bits ? "gave mma.sync's bits and were timed beside them"
                          : "wrote other bits than mma.sync's and were left out");
#ifdef GNMR_CUDA_EMULATED
    EXPECT_TRUE(same_bits) << chosen.log;
    for (const char* pass : {"the forward", "the backward"}) {
      EXPECT_NE(logged_choice(chosen.log, pass).line.find("wgmma"), std::string::npos)
          << pass << ": wgmma timed beside mma.sync\n"
          << chosen.log;
    }
    // The emulated wgmma rounding otherwise for this run only, whatever it throws.
    struct RoundingTowardZero {
      RoundingTowardZero() { emulated_set_wgmma_rounds_toward_zero(true); }
      ~RoundingTowardZero() { emulated_set_wgmma_rounds_toward_zero(false); }
    };
    const BackendAttentionCalls refused = [&] {
      const RoundingTowardZero rounding;
      return backend_attention_calls(options, shape);
    }();
    expect_same_call_bits(refused, mma_sync);
    for (const char* pass : {"the forward", "the backward"}) {
      SCOPED_TRACE(pass);
      EXPECT_NE(refused.log.find(std::string(pass) + "'s wgmma kernels wrote other bits"),
                std::string::npos)
          << refused.log;
      const std::string line = logged_choice(refused.log, pass).line;
      EXPECT_NE(line.find("mma.sync"), std::string::npos) << refused.log;
      EXPECT_EQ(line.find("wgmma"), std::string::npos) << line;
    }
#endif
  });
}

// Under auto the wgmma kernels are offered at a shape only where CudaBackendOptions::wgmma_trial
// answers "" for it, asked once per shape: a failing trial leaves them out with a warning that
// gives its answer, and mma.sync alone runs. And the trial make_backend runs, `gnmr
// wgmma-trial` in a child process (train/wgmma_trial.h), passes where the wgmma kernels give
// the mma.sync kernels' bits: on the emulation it must; on a GPU the line printed says what
// happened there, and the calls give the mma.sync kernels' bits either way.
TEST(GpuFlashAttention, AutoOffersTheWgmmaKernelsOnlyWhereTheirTrialProcessPasses) {
  SKIP_WITHOUT_WGMMA();
  const AttentionShape shape{1, 130, 4, 2, 64};
  CudaBackendOptions options;
  options.attention = CudaAttention::FlashBf16;
  options.flash_tiles = FlashTiles::Defaults;
  const BackendAttentionCalls mma_sync = backend_attention_calls(options, shape);

  options.attention = CudaAttention::Auto;
  options.flash_tiles = FlashTiles::Timed;
  std::vector<std::string> asked;
  options.wgmma_trial = [&](const AttentionShape& s) {
    asked.push_back(attention_shape_text(s));
    return std::string("the trial process was ended by signal 11 (Segmentation fault)");
  };
  {
    gnmr_test::CapturedLog log;
    std::unique_ptr<Backend> be = make_cuda_backend(options);
    be->set_gemm_precision(GemmPrecision::BF16);
    const AttentionShape other{1, 64, 4, 2, 64};
    for (const AttentionShape& s : {shape, shape, other}) {
      const std::unique_ptr<AttentionState> state = be->plan_attention("attention", s, false);
      EXPECT_EQ(state->kernel().find("wgmma"), std::string::npos) << state->kernel();
    }
    EXPECT_EQ(asked,
              (std::vector<std::string>{attention_shape_text(shape), attention_shape_text(other)}))
        << "once per shape";
    EXPECT_NE(log.text().find("at " + attention_shape_text(shape) +
                              ": the wgmma kernels are left out (the trial process was ended by "
                              "signal 11 (Segmentation fault)); running mma.sync"),
              std::string::npos)
        << log.text();
  }
  const BackendAttentionCalls refused = backend_attention_calls(options, shape);
  for (const char* pass : {"the forward", "the backward"}) {
    const std::string line = logged_choice(refused.log, pass).line;
    EXPECT_NE(line.find("mma.sync"), std::string::npos) << refused.log;
    EXPECT_EQ(line.find("wgmma"), std::string::npos) << line;
  }
  expect_same_call_bits(refused, mma_sync);

  int device = 0;
  GNMR_CUDA_CHECK(cudaGetDevice(&device));
  options.wgmma_trial = [device](const AttentionShape& s) {
    return run_wgmma_trial_process(gnmr_test::gnmr_binary(), device, s);
  };
  const BackendAttentionCalls tried = backend_attention_calls(options, shape);
  const size_t left_out = tried.log.find("the wgmma kernels are left out");
  const bool passed = left_out == std::string::npos;
  std::printf("wgmma trial process, hd 64: %s\n",
              passed
                  ? "passed; the wgmma kernels were timed beside mma.sync"
                  : tried.log.substr(left_out, tried.log.find('\n', left_out) - left_out).c_str());
  expect_same_call_bits(tried, mma_sync);
#ifdef GNMR_CUDA_EMULATED
  EXPECT_TRUE(passed) << tried.log;
  EXPECT_NE(tried.log.find("the wgmma attention kernels passed their trial at B=1 T=130 H=4 Hkv=2 "
                           "hd=64 in a process of their own"),
            std::string::npos)
      << tried.log;
  EXPECT_NE(logged_choice(tried.log, "the forward").line.find("wgmma"), std::string::npos)
      << tried.log;
#endif
}

// make_backend runs the wgmma trial before the backend makes the process's CUDA context
// (run_wgmma_trial_before_backend): on a GPU in exclusive-process mode the trial's own process
// could not make one after it. It asks exactly where the backend would (auto under bf16 GEMMs,
// the tensor-core kernels at the shape, the tiles timed), and the backend then finds the answer
// made: one trial process for the command, and wgmma timed.
TEST(GpuFlashAttention, TheWgmmaTrialRunsBeforeTheBackendWhereTheBackendWouldAskIt) {
  SKIP_WITHOUT_WGMMA();
  const AttentionShape shape{1, 130, 4, 2, 64};
  CudaBackendOptions options;
  GNMR_CUDA_CHECK(cudaGetDevice(&options.device));
  options.attention = CudaAttention::Auto;
  options.flash_tiles = FlashTiles::Timed;
  std::vector<std::string> asked;
  options.wgmma_trial = [&](const AttentionShape& s) {
    asked.push_back(attention_shape_text(s));
    return std::string();
  };
  run_wgmma_trial_before_backend(options, /*bf16_gemms=*/false, shape);  // the SIMT kernels
  run_wgmma_trial_before_backend(options, true, AttentionShape{1, 130, 4, 2, 96});  // v1
  for (const auto& [attention, tiles] : {std::pair{CudaAttention::FlashBf16, FlashTiles::Timed},
                                         std::pair{CudaAttention::FlashWgmma, FlashTiles::Timed},
                                         std::pair{CudaAttention::Auto, FlashTiles::Defaults}}) {
    CudaBackendOptions other = options;
    other.attention = attention;
    other.flash_tiles = tiles;
    run_wgmma_trial_before_backend(other, true, shape);
  }
  EXPECT_TRUE(asked.empty()) << asked.front();
  run_wgmma_trial_before_backend(options, true, shape);
  EXPECT_EQ(asked, std::vector<std::string>{attention_shape_text(shape)});

  options.wgmma_trial = wgmma_trial_processes(gnmr_test::gnmr_binary(), options.device);
  std::string before;
  {
    gnmr_test::CapturedLog log;
    run_wgmma_trial_before_backend(options, true, shape);
    before = log.text();
  }
  const BackendAttentionCalls calls = backend_attention_calls(options, shape);
  const std::string passed = "the wgmma attention kernels passed their trial at " +
                             attention_shape_text(shape) + " in a process of their own";
  EXPECT_EQ(calls.log.find(passed), std::string::npos) << "the backend ran it again:\n"
                                                       << calls.log;
#ifdef GNMR_CUDA_EMULATED  // on a GPU the other test prints whether the trial passes
  EXPECT_NE(before.find(passed), std::string::npos) << before;
  EXPECT_NE(logged_choice(calls.log, "the forward").line.find("wgmma"), std::string::npos)
      << calls.log;
#endif
}

// Through the backend: rope_attention_forward gives the out of RoPE on q and k, then
// attention_forward, and after the backward the same gradients, bit for bit (tables longer than
// the sequence, as the model's). The tensor-core kernels rotate q and k as they copy them to
// bf16 and leave them as they were; the SIMT kernels rotate them in place first.
TEST(GpuFlashAttention, RopeAttentionForwardIsRopeThenAttentionAndTheTensorCoresLeaveQAndK) {
  SKIP_WITHOUT_GPU();
  const AttentionShape shape{2, 130, 8, 2, 64};
  const int64_t b = shape.batch, t = shape.seq, h = shape.heads, hkv = shape.kv_heads,
                hd = shape.head_dim;
  std::vector<float> cos, sin;
  compute_rope_table(10000.0f, int(hd), int(t + 3), cos, sin);
  const std::vector<int64_t> q_dims = {b, t, h, hd}, kv_dims = {b, t, hkv, hd};
  const std::vector<float> q0 = gnmr_test::random_normal(size_t(b * t * h * hd), 1),
                           k0 = gnmr_test::random_normal(size_t(b * t * hkv * hd), 2),
                           v0 = gnmr_test::random_normal(size_t(b * t * hkv * hd), 3),
                           dout0 = gnmr_test::random_normal(size_t(b * t * h * hd), 4);
  for (CudaAttention kernel : {CudaAttention::FlashBf16, CudaAttention::Flash}) {
    CudaBackendOptions options;
    options.attention = kernel;
    std::unique_ptr<Backend> be = make_cuda_backend(options);
    auto upload = [&](const char* name, std::vector<int64_t> dims, const std::vector<float>& x) {
      Tensor tensor = be->allocate(name, std::move(dims), DType::F32, MemoryRole::Scratch);
      be->copy_from_host(tensor, x.data());
      return tensor;
    };
    auto download = [&](const Tensor& x) {
      std::vector<float> host(size_t(x.numel()));
      be->copy_to_host(x, host.data());
      return host;
    };
    const Tensor cos_t = upload("cos", {t + 3, hd / 2}, cos),
                 sin_t = upload("sin", {t + 3, hd / 2}, sin);
    std::vector<std::vector<float>> results[2];  // out, dq, dk, dv, q and k afterwards
    std::string name;
    for (int fused = 0; fused < 2; ++fused) {
      std::unique_ptr<AttentionState> state = be->plan_attention("attention", shape, false);
      name = state->kernel();
      Tensor q = upload("q", q_dims, q0), k = upload("k", kv_dims, k0);
      const Tensor v = upload("v", kv_dims, v0), dout = upload("dout", q_dims, dout0);
      Tensor out = upload("out", q_dims, q0), dq = upload("dq", q_dims, q0),
             dk = upload("dk", kv_dims, k0), dv = upload("dv", kv_dims, k0);
      if (fused == 1) {
        be->rope_attention_forward(q, k, v, cos_t, sin_t, out, *state);
      } else {
        be->rope_forward(q, cos_t, sin_t);
        be->rope_forward(k, cos_t, sin_t);
        be->attention_forward(q, k, v, out, *state);
      }
      be->attention_backward(q, k, v, *state, dout, dq, dk, dv);
      for (const Tensor* x : {&out, &dq, &dk, &dv, &q, &k}) results[fused].push_back(download(*x));
    }
    SCOPED_TRACE(name);
    const char* what[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(std::memcmp(results[0][i].data(), results[1][i].data(),
                            results[0][i].size() * sizeof(float)),
                0)
          << what[i];
    }
    if (kernel == CudaAttention::FlashBf16) {
      EXPECT_EQ(results[1][4], q0) << "q left as it was";
      EXPECT_EQ(results[1][5], k0) << "k left as it was";
    } else {
      EXPECT_EQ(results[1][4], results[0][4]) << "q rotated in place";
      EXPECT_NE(results[1][4], q0);
    }
  }
}

// Decided on the host before any launch, so it runs without a GPU too.
// model.attention auto follows the GEMMs' precision: the tensor-core kernels under bf16 GEMMs,
// the fp32 SIMT ones under fp32, v1 for a head dim the flash kernels lack.
TEST(GpuFlashAttention, AutoRunsTheFlashKernelsOfTheGemmPrecision) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions options;  // the default tiles: the timed ones' text has its own test
  options.flash_tiles = FlashTiles::Defaults;
  std::unique_ptr<Backend> be = make_cuda_backend(options);
  const AttentionShape shape{2, 130, 8, 2, 64}, unsupported{2, 130, 8, 2, 96};
  be->set_gemm_precision(GemmPrecision::BF16);
  EXPECT_EQ(be->plan_attention("a", shape, false)->kernel(),
            "flash_bf16 (bf16 tensor cores, mma.sync; query tiles of " +
                std::to_string(kFlashMmaForwardQueryTile) +
                " rows in the forward, 128 in the dq pass)");
  EXPECT_EQ(be->plan_attention("a", unsupported, false)->kernel().rfind("materialized", 0), 0u);
  be->set_gemm_precision(GemmPrecision::FP32);
  EXPECT_EQ(be->plan_attention("a", shape, false)->kernel(), "flash (fp32 SIMT)");
}

// model.attention flash_wgmma plans the tensor-core kernels on wgmma where they run (sm_90a),
// and elsewhere refuses at plan time, naming what is missing.
TEST(GpuFlashAttention, FlashWgmmaPlansTheWgmmaKernelsOrSaysWhyNot) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions options;
  options.attention = CudaAttention::FlashWgmma;
  options.flash_tiles = FlashTiles::Defaults;
  std::unique_ptr<Backend> be = make_cuda_backend(options);
  const AttentionShape shape{2, 130, 8, 2, 64};
  int device = 0;
  GNMR_CUDA_CHECK(cudaGetDevice(&device));
  if (flash_wgmma_unavailable(device).empty()) {
    EXPECT_EQ(be->plan_attention("a", shape, false)->kernel(),
              "flash_wgmma (bf16 tensor cores, wgmma; query tiles of " +
                  std::to_string(kFlashMmaForwardQueryTile) +
                  " rows in the forward, 128 in the dq pass)");
  } else {
    try {
      be->plan_attention("a", shape, false);
      ADD_FAILURE() << "flash_wgmma planned where wgmma does not run";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.attention \"flash_wgmma\" needs sm_90a"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(GpuFlashAttention, RefusesAnUnsupportedHeadDimNamingTheShape) {
  EXPECT_FALSE(flash_attention_supports_head_dim(96));
  EXPECT_TRUE(flash_attention_supports_head_dim(64));
  EXPECT_TRUE(flash_attention_supports_head_dim(128));
  try {
    flash_attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, 2, 17, 8, 2, 96, nullptr);
    FAIL() << "head dim 96 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("head_dim 96 (B=2 T=17 H=8 Hkv=2 hd=96)"),
              std::string::npos)
        << e.what();
  }
}

// The forward's query tile is 64 or 128 rows, the dq pass's 64, or 128 at head dim 64; another
// is refused, naming it, before anything runs (no GPU needed).
TEST(GpuFlashAttention, TensorCoreKernelsRefuseAQueryTileTheyDoNotTake) {
  alignas(16) static float storage[8];
  for (const int64_t query_tile : {int64_t{0}, int64_t{32}, int64_t{96}, int64_t{256}}) {
    try {
      flash_attention_forward_mma(storage, storage, storage, nullptr, nullptr, storage, storage,
                                  storage, 1, 5, 2, 1, 64, nullptr, query_tile);
      ADD_FAILURE() << "a query tile of " << query_tile << " rows was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Runtime);
      EXPECT_NE(std::string(e.what()).find("a forward query tile of " + std::to_string(query_tile) +
                                           " rows; it takes 64 or 128"),
                std::string::npos)
          << e.what();
    }
  }
  // The dq pass takes 128-row tiles only at head dim 64.
  for (const auto& [query_tile, head_dim] : {std::pair<int64_t, int64_t>{128, 128}, {96, 64}}) {
    try {
      flash_attention_backward_mma(storage, storage, storage, storage, storage, storage, storage,
                                   storage, 1, 5, 2, 1, head_dim, nullptr, query_tile);
      ADD_FAILURE() << "a dq pass query tile of " << query_tile << " rows at head dim " << head_dim
                    << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Runtime);
      EXPECT_NE(std::string(e.what()).find("a dq pass query tile of " + std::to_string(query_tile) +
                                           " rows at head dim " + std::to_string(head_dim) +
                                           "; it takes 64, or 128 at head dim 64"),
                std::string::npos)
          << e.what();
    }
  }
}

// The tensor-core kernels read their buffers' bf16 rows 16 bytes at a time: a buffer off a
// 16-byte boundary is refused before anything runs (no GPU needed: the check comes first).
TEST(GpuFlashAttention, TensorCoreKernelsRefuseABufferOffA16ByteBoundary) {
  alignas(16) static float storage[8];
  float* aligned = storage;
  void* off_by_one_float = storage + 1;
  const auto expect_refused = [](const char* buffer, const std::function<void()>& call) {
    try {
      call();
      FAIL() << buffer << " off a 16-byte boundary was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Runtime);
      EXPECT_NE(std::string(e.what()).find(std::string("the ") + buffer +
                                           " for B=1 T=5 H=2 Hkv=1 hd=64 does not start on a "
                                           "16-byte boundary"),
                std::string::npos)
          << e.what();
    }
  };
  expect_refused("inputs' bf16 copies", [&] {
    flash_attention_forward_mma(aligned, aligned, aligned, nullptr, nullptr, aligned, aligned,
                                off_by_one_float, 1, 5, 2, 1, 64, nullptr,
                                kFlashMmaForwardQueryTile);
  });
  expect_refused("inputs' bf16 copies", [&] {
    flash_attention_backward_mma(off_by_one_float, aligned, aligned, aligned, aligned, aligned,
                                 aligned, aligned, 1, 5, 2, 1, 64, nullptr, 64);
  });
  expect_refused("scratch", [&] {
    flash_attention_backward_mma(aligned, aligned, aligned, aligned, aligned, aligned, aligned,
                                 off_by_one_float, 1, 5, 2, 1, 64, nullptr, 64);
  });
}

}  // namespace
}  // namespace gnmr::cuda
