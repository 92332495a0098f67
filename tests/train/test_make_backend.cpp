// make_backend, the one place a backend is made: the config's choices reach the backend, and
// a backend this binary lacks is refused with the fix.
#include <gtest/gtest.h>

#include "config/config.h"
#include "expect_error.h"
#include "test_paths.h"
#include "train/make_backend.h"
#ifdef GNMR_WITH_CUDA
#include "backend/cuda/device_probe.h"
#endif

namespace {

gnmr::RunConfig tiny_config(const std::vector<std::string>& overrides) {
  return gnmr::load_run_config(gnmr_test::source_path("configs/models/tiny.json"), overrides);
}

TEST(MakeBackend, CpuRunsAtTheConfiguredGemmPrecision) {
  auto fp32 = gnmr::make_backend(tiny_config({}));
  EXPECT_EQ(fp32->name(), "cpu");
  EXPECT_EQ(fp32->gemm_precision(), gnmr::GemmPrecision::FP32);
  auto bf16 = gnmr::make_backend(tiny_config({"train.gemm_precision=bf16"}));
  EXPECT_EQ(bf16->gemm_precision(), gnmr::GemmPrecision::BF16);
}

#ifdef GNMR_WITH_CUDA
// A CUDA build makes the cuda backend where a GPU is usable, and elsewhere refuses with the
// probe's reason and the fix.
TEST(MakeBackend, CudaRunsWhereAGpuIsUsableAndElseSaysWhy) {
  const gnmr::CudaDeviceProbe probe = gnmr::probe_cuda_device(0);
  if (probe.usable) {
    auto backend = gnmr::make_backend(tiny_config({"backend=cuda"}));
    EXPECT_EQ(backend->name(), "cuda");
    return;
  }
  gnmr_test::expect_error([] { gnmr::make_backend(tiny_config({"backend=cuda"})); },
                          gnmr::ErrorKind::Runtime,
                          {"cuda backend: ", probe.problem, "use backend=cpu"});
}
#else
TEST(MakeBackend, CudaIsNotInThisBuildAndTheMessageSaysWhatToUse) {
  gnmr_test::expect_error([] { gnmr::make_backend(tiny_config({"backend=cuda"})); },
                          gnmr::ErrorKind::NotBuilt,
                          {"backend \"cuda\" is not in this binary", "use backend=cpu"});
}
#endif

}  // namespace
