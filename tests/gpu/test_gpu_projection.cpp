// One projection (plan_projection, projection_forward / projection_backward) on the CUDA backend
// against the CPU backend, per path and GEMM precision: y, dx (accumulated) and dw (accumulated)
// from the same inputs. Narrower than the training comparison (test_gpu_training.cpp), so a
// disagreement there can be placed in one role of one path. Skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"

namespace gnmr {
namespace {

// Multiples of 128, so the FP8 path runs cuBLASLt's block-scaled GEMM on sm_90.
constexpr int64_t kTokens = 256, kIn = 384, kOut = 256;

struct Outputs {
  std::vector<float> y, dx, dw;
};

Tensor upload(Backend& be, const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor t = be.allocate("t", std::move(shape), DType::F32, MemoryRole::Scratch);
  be.copy_from_host(t, values.data());
  return t;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  be.copy_to_host(t, out.data());
  return out;
}

Outputs run(Backend& be, GemmPrecision gemms, const PathSpec& path, bool dy_dead) {
  be.set_gemm_precision(gemms);
  ProjectionShape shape{kTokens, kIn, kOut};
  shape.backward_may_overwrite_dy = dy_dead;  // as the lm_head's dlogits
  std::unique_ptr<ProjectionState> state = be.plan_projection("unit", shape, path, path);
  using gnmr_test::random_normal;
  const Tensor w = upload(be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
  const Tensor x = upload(be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
  Tensor dy = upload(be, random_normal(size_t(kTokens * kOut), 3), {kTokens, kOut});
  Tensor dx = upload(be, random_normal(size_t(kTokens * kIn), 4), {kTokens, kIn});
  Tensor dw = upload(be, random_normal(size_t(kOut * kIn), 5), {kOut, kIn});
  Tensor y = be.allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  be.projection_forward(*state, path, w, x, y, /*save=*/true, RngKey{7, 3, 11});
  be.projection_backward(*state, path, w, dy, dx, /*accumulate_dx=*/true, dw);
  return {download(be, y), download(be, dx), download(be, dw)};
}

// max |gpu - cpu| / max |cpu| over a tensor.
double relative_difference(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    diff = std::max(diff, std::fabs(double(gpu[i]) - double(cpu[i])));
    scale = std::max(scale, std::fabs(double(cpu[i])));
  }
  return diff / scale;
}

struct Case {
  const char* name;
  GemmPrecision gemms;
  PathSpec path;
  // The same operand bits on both backends, fp32 accumulation in another order: a few ulps of
  // a 384-term sum relative to the tensor's largest entry; 1e-5 leaves a factor of ~100.
  // FP8: the same codes, Hopper's reduced-precision accumulation: 1e-3.
  double tolerance;
};

TEST(GpuProjection, EveryPathAndGemmPrecisionMatchesTheCpuPerRole) {
  SKIP_WITHOUT_GPU();
  PathSpec bf16;
  bf16.kind = PathKind::kBf16Gemm;
  PathSpec fp8;
  fp8.kind = PathKind::kFineGrainedFp;
  const std::vector<Case> cases = {{"fp32 gemms", GemmPrecision::FP32, PathSpec{}, 1e-5},
                                   {"bf16 gemms", GemmPrecision::BF16, PathSpec{}, 1e-5},
                                   {"bf16 path", GemmPrecision::FP32, bf16, 1e-5},
                                   {"fp8 path", GemmPrecision::FP32, fp8, 1e-3}};
  for (const Case& c : cases) {
    for (const bool dy_dead : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (dy_dead ? ", dy dead after the backward" : ""));
      std::unique_ptr<Backend> cpu = make_cpu_backend(2);
      std::unique_ptr<Backend> gpu = make_cuda_backend(CudaBackendOptions{});
      const Outputs want = run(*cpu, c.gemms, c.path, dy_dead);
      const Outputs got = run(*gpu, c.gemms, c.path, dy_dead);
      EXPECT_LE(relative_difference(got.y, want.y), c.tolerance) << "y";
      EXPECT_LE(relative_difference(got.dx, want.dx), c.tolerance) << "dx";
      EXPECT_LE(relative_difference(got.dw, want.dw), c.tolerance) << "dw";
    }
  }
}

}  // namespace
}  // namespace gnmr
