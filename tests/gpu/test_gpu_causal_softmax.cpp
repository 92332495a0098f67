// The causal softmax kernels of attention v1 (kernels/causal_softmax.cu) alone, against a plain
// host loop in double. Apart from test_gpu_attention.cpp (which needs cuBLASLt) so that the
// CUDA emulation's test_gpu_emulated runs them too. Skip without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"

namespace gnmr::cuda {
namespace {

using gnmr_test::DeviceBuffer;
using gnmr_test::random_normal;

constexpr double kUnitRoundoff = 1.0 / (1 << 24);  // fp32: 2^-24

// The kernels alone against a plain host loop in double on the same fp32 inputs; t = 700 puts
// more than one element on each of the kernel's at most 512 threads.
TEST(GpuCausalSoftmax, ForwardAndBackwardMatchAPlainHostLoop) {
  SKIP_WITHOUT_GPU();
  const float scale = 0.125f;
  for (int64_t t : {1, 17, 128, 700}) {
    SCOPED_TRACE("t=" + std::to_string(t));
    const int64_t matrices = 3;
    const size_t n = size_t(matrices * t * t);
    std::vector<float> scores = random_normal(n, 21), dprobs = random_normal(n, 22);
    for (float& x : scores) x *= 4.0f;  // a spread that makes the max shift matter
    // NaN above the diagonal: the kernels must overwrite it with exact zeros, never read it.
    for (int64_t r = 0; r < matrices * t; ++r) {
      for (int64_t j = r % t + 1; j < t; ++j) {
        scores[size_t(r * t + j)] = dprobs[size_t(r * t + j)] = std::nanf("");
      }
    }
    DeviceBuffer<float> p(scores), ds(dprobs);
    causal_softmax_forward(p.get(), matrices, t, nullptr);
    causal_softmax_backward(p.get(), ds.get(), matrices, t, scale, nullptr);
    GNMR_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got_p = p.to_host(), got_ds = ds.to_host();
    for (int64_t r = 0; r < matrices * t; ++r) {
      const int64_t i = r % t;
      const float* s = scores.data() + r * t;
      // The kernel subtracts the row max in fp32, as its CPU twin does; that rounding, up to
      // |s - max| u absolute, becomes as much relative error after exp (16-32 u at this
      // spread), so the host's P takes the same fp32 argument: exp of it in double, normalised.
      // The kernel's P is then within expf's 2 ulp plus the roundings of e, 1 / sum and the
      // product (< 4 ulp): 8 u relative leaves headroom.
      float max_score = s[0];
      for (int64_t j = 0; j <= i; ++j) max_score = std::max(max_score, s[j]);
      std::vector<double> e(size_t(i + 1));
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) sum += e[size_t(j)] = std::exp(double(s[j] - max_score));
      double dot = 0.0, dot_abs = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        const float pj = got_p[size_t(r * t + j)];
        const double want = e[size_t(j)] / sum;
        ASSERT_NEAR(pj, want, 8 * kUnitRoundoff * want) << "P row " << r << " key " << j;
        dot += double(pj) * dprobs[size_t(r * t + j)];
        dot_abs += std::abs(double(pj) * dprobs[size_t(r * t + j)]);
      }
      for (int64_t j = 0; j <= i; ++j) {
        // dS from the kernel's own P, so only the backward's roundings count: the products,
        // the dot rounded to fp32 (u |dot| + u sum |p dP|), dP - dot and the two multiplies.
        const double pj = got_p[size_t(r * t + j)], dpj = dprobs[size_t(r * t + j)];
        const double want = double(scale) * pj * (dpj - dot);
        const double bound =
            8 * kUnitRoundoff * double(scale) * pj * (std::abs(dpj) + dot_abs) + 1e-30;
        ASSERT_NEAR(got_ds[size_t(r * t + j)], want, bound) << "dS row " << r << " key " << j;
      }
      for (int64_t j = i + 1; j < t; ++j) {
        ASSERT_EQ(got_p[size_t(r * t + j)], 0.0f);
        ASSERT_EQ(got_ds[size_t(r * t + j)], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace gnmr::cuda
