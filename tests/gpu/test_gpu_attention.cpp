// The v1 CUDA attention (backend/cuda/attention_v1.h: cuBLASLt strided-batched GEMMs and the
// causal softmax kernels of kernels/causal_softmax.cu) against its CPU twin
// cpu::attention_forward / attention_backward<float> (src/backend/cpu/attention.cpp): out, P,
// dq, dk, dv for T in {1, 17, 128}, H = Hkv and GQA (H = 8, Hkv = 2), hd 64 and 128, B = 2,
// with fp32 GEMMs and with the bf16 runs' (attention_v1_compute_type); bit determinism over two
// runs; outputs poisoned with NaN before the call are fully overwritten (the softmax kernels
// alone: test_gpu_causal_softmax.cpp). Skip without a GPU.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cublaslt_descriptors.h"
#include "gpu_test_util.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"

namespace gnmr::cuda {
namespace {

using gnmr_test::DeviceBuffer;

constexpr double kUnitRoundoff = 1.0 / (1 << 24);  // fp32: 2^-24
constexpr double kBf16UnitRoundoff = 1.0 / 256;    // bf16: 2^-8

using gnmr_test::count_non_finite;
using gnmr_test::poison;
using gnmr_test::random_normal;
using gnmr_test::relative_error;

// One handle and workspace for the test binary, as the backend has one.
class Lt {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  Lt() {
    GNMR_CUBLASLT_CHECK(cublasLtCreate(&handle_), "test handle");
    GNMR_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  }
  ~Lt() {
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

struct Result {
  std::vector<float> out, probs, dq, dk, dv;
};

struct Inputs {
  std::vector<float> q, k, v, dout;
  explicit Inputs(const AttentionShape& s) {
    const size_t nq = size_t(s.batch * s.seq * s.heads * s.head_dim);
    const size_t nkv = size_t(s.batch * s.seq * s.kv_heads * s.head_dim);
    q = random_normal(nq, 11), k = random_normal(nkv, 12), v = random_normal(nkv, 13);
    dout = random_normal(nq, 14);
  }
};

Result run_gpu(MaterializedAttention& attention, const Inputs& in, const AttentionShape& s,
               GemmPrecision precision = GemmPrecision::FP32) {
  const size_t np = size_t(s.batch * s.heads * s.seq * s.seq);
  const size_t scratch_floats = size_t(MaterializedAttention::backward_scratch_floats(s));
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), dout(in.dout);
  DeviceBuffer<float> out(in.q.size()), probs(np), dq(in.q.size()), dk(in.k.size()),
      dv(in.k.size()), scratch(scratch_floats);
  poison(out, in.q.size()), poison(probs, np), poison(dq, in.q.size());
  poison(dk, in.k.size()), poison(dv, in.k.size()), poison(scratch, scratch_floats);
  attention.forward(q.get(), k.get(), v.get(), out.get(), probs.get(), s, precision, nullptr);
  attention.backward(q.get(), k.get(), v.get(), probs.get(), dout.get(), dq.get(), dk.get(),
                     dv.get(), scratch.get(), s, precision, nullptr);
  GNMR_CUDA_CHECK(cudaDeviceSynchronize());
  return {out.to_host(), probs.to_host(), dq.to_host(), dk.to_host(), dv.to_host()};
}

Result run_cpu(const Inputs& in, const AttentionShape& s) {
  Result r;
  r.out.resize(in.q.size()), r.dq.resize(in.q.size());
  r.dk.resize(in.k.size()), r.dv.resize(in.k.size());
  r.probs.resize(size_t(s.batch * s.heads * s.seq * s.seq));
  cpu::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.probs.data(),
                                s, 2);
  std::vector<float> workspace(size_t(cpu::attention_backward_workspace(s, 2)));
  cpu::attention_backward<float>(in.q.data(), in.k.data(), in.v.data(), r.probs.data(),
                                 in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(), s,
                                 workspace.data(), 2);
  return r;
}

std::vector<AttentionShape> shapes() {
  std::vector<AttentionShape> all;
  for (int64_t t : {1, 17, 128}) {
    for (int64_t hd : {64, 128}) {
      all.push_back({2, t, 4, 4, hd});
      all.push_back({2, t, 8, 2, hd});
    }
  }
  return all;
}

// gpu against cpu: every output written (poisoned with NaN before the call: any element left
// unwritten is still NaN), probs and out within forward_tol, the gradients within
// backward_tol (norm-wise relative errors), and the causal mask exact: P above the diagonal is
// 0.0f, not merely small.
void expect_within(const Result& gpu, const Result& cpu, const AttentionShape& s,
                   double forward_tol, double backward_tol) {
  for (const auto* x : {&gpu.out, &gpu.probs, &gpu.dq, &gpu.dk, &gpu.dv}) {
    ASSERT_EQ(count_non_finite(*x), 0u);
  }
  EXPECT_LE(relative_error(gpu.probs, cpu.probs), forward_tol) << "probs";
  EXPECT_LE(relative_error(gpu.out, cpu.out), forward_tol) << "out";
  EXPECT_LE(relative_error(gpu.dq, cpu.dq), backward_tol) << "dq";
  EXPECT_LE(relative_error(gpu.dk, cpu.dk), backward_tol) << "dk";
  EXPECT_LE(relative_error(gpu.dv, cpu.dv), backward_tol) << "dv";
  for (int64_t m = 0; m < s.batch * s.heads; ++m) {
    for (int64_t i = 0; i < s.seq; ++i) {
      for (int64_t j = i + 1; j < s.seq; ++j) {
        ASSERT_EQ(gpu.probs[size_t((m * s.seq + i) * s.seq + j)], 0.0f);
      }
    }
  }
}

TEST(GpuAttention, MatchesTheCpuForwardAndBackwardAndOverwritesEveryOutput) {
  SKIP_WITHOUT_GPU();
  Lt lt;
  MaterializedAttention attention(lt.handle(), lt.workspace(), Lt::kWorkspaceBytes);
  for (const AttentionShape& s : shapes()) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    // Tolerance: both sides are fp32 GEMMs over the same inputs with different summation
    // orders (and CUDA's expf against the CPU's, each within a few ulp). An inner product of
    // length K in fp32 is off by at most ~K u |a||b| (u = 2^-24) in any order, so two orders
    // differ by at most 2 K u in the norm; K is at most max(T, hd). The forward is one GEMM
    // deep after the softmax (P v over T terms, the scores over hd); the backward chains dP
    // (hd terms), the softmax backward and dq / dk (T terms), so it gets 3x the forward's
    // bound. This is the worst case; random data typically lands ~sqrt(K) below it, while an
    // index or transpose error is O(1).
    const double forward_tol = 2.0 * double(std::max(s.seq, s.head_dim)) * kUnitRoundoff;
    expect_within(run_gpu(attention, in, s), run_cpu(in, s), s, forward_tol, 3.0 * forward_tol);
  }
}

// Under bf16 GEMMs (CUBLAS_COMPUTE_32F_FAST_16BF) cuBLASLt may round each fp32 operand to bf16
// (unit roundoff u = 2^-8; the emulation always does), so each product a_i b_i is off by up to
// 2u of |a_i b_i|; with random signs those errors add as a random walk, so a GEMM's norm-wise
// relative error is about u, and the softmax passes the scores' error on to P about one for one.
// 4u for the forward (scores, P, out) and 3x that for the backward's chain (dP, dS, then dq /
// dk / dv: two rounded GEMMs deep); the emulation measures at most 0.8u and 1.0u on these
// shapes, while an index or transpose error, O(1), cannot pass. The mask stays exact, and every
// output is written.
TEST(GpuAttention, MatchesTheCpuWithBf16GemmsWithinTheirRounding) {
  SKIP_WITHOUT_GPU();
  Lt lt;
  MaterializedAttention attention(lt.handle(), lt.workspace(), Lt::kWorkspaceBytes);
  for (const AttentionShape& s : shapes()) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    const Result gpu = run_gpu(attention, in, s, GemmPrecision::BF16);
    expect_within(gpu, run_cpu(in, s), s, 4.0 * kBf16UnitRoundoff, 12.0 * kBf16UnitRoundoff);
#ifdef GNMR_CUDA_EMULATED
    // The emulation rounds the operands to bf16, so the precision must reach cuBLASLt: at
    // T > 1 the scores differ from the fp32 GEMMs' (on a GPU cuBLASLt may pick any kernel
    // the compute type allows, fp32 ones included).
    if (s.seq > 1) {
      const Result fp32 = run_gpu(attention, in, s, GemmPrecision::FP32);
      EXPECT_NE(std::memcmp(fp32.probs.data(), gpu.probs.data(), gpu.probs.size() * sizeof(float)),
                0);
    }
#endif
  }
}

TEST(GpuAttention, GivesTheSameBitsOnEveryRun) {
  SKIP_WITHOUT_GPU();
  Lt lt;
  MaterializedAttention attention(lt.handle(), lt.workspace(), Lt::kWorkspaceBytes);
  for (const AttentionShape& s :
       {AttentionShape{2, 128, 8, 2, 64}, AttentionShape{2, 17, 8, 2, 128}}) {
    SCOPED_TRACE(attention_shape_text(s));
    const Inputs in(s);
    const Result first = run_gpu(attention, in, s);
    const Result second = run_gpu(attention, in, s);
    const std::vector<const std::vector<float>*> a = {&first.out, &first.probs, &first.dq,
                                                      &first.dk, &first.dv};
    const std::vector<const std::vector<float>*> b = {&second.out, &second.probs, &second.dq,
                                                      &second.dk, &second.dv};
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i]->size(), b[i]->size());
      EXPECT_EQ(std::memcmp(a[i]->data(), b[i]->data(), a[i]->size() * sizeof(float)), 0)
          << "output " << i << " (out, probs, dq, dk, dv)";
    }
  }
}

}  // namespace
}  // namespace gnmr::cuda
