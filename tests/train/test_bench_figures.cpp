// What `gnmr bench` quotes MFU against on a GPU (the datasheet peak by device name) and how
// it names each projection's GEMMs (gemm_impl), checked on the CPU backend.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "config/config.h"
#include "model/llama.h"
#include "test_paths.h"
#include "train/bench.h"

namespace {

TEST(BenchFigures, DatasheetPeaksByTheNamesTheDriverReports) {
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)"), 989.4);
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA H200 (sm_90, 139 GiB)"), 989.4);
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA H100 PCIe (sm_90, 79 GiB)"), 756.0);
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA H100 NVL (sm_90, 93 GiB)"), 835.0);
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA H200 NVL (sm_90, 140 GiB)"), 835.0);
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA A100-SXM4-80GB (sm_80, 79 GiB)"), 312.0);
  EXPECT_DOUBLE_EQ(gnmr::datasheet_bf16_tflops("NVIDIA GeForce RTX 4090"), 0.0);
}

TEST(BenchFigures, HiddenGradientSumIsTheShareOfTheBlockingSumNotWaitedFor) {
  EXPECT_DOUBLE_EQ(gnmr::gradient_sum_hidden_fraction(10.0, 10.0), 0.0);  // nothing overlapped
  EXPECT_DOUBLE_EQ(gnmr::gradient_sum_hidden_fraction(10.0, 2.5), 0.75);
  EXPECT_DOUBLE_EQ(gnmr::gradient_sum_hidden_fraction(10.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(gnmr::gradient_sum_hidden_fraction(10.0, 14.0), 0.0);  // a late rank
  EXPECT_DOUBLE_EQ(gnmr::gradient_sum_hidden_fraction(0.0, 1.0), 0.0);    // one rank: no sum
}

TEST(BenchFigures, GemmImplNamesEveryKindAndPathOfTheRecipe) {
  const gnmr::RunConfig config = gnmr::load_run_config(
      gnmr_test::source_path("configs/models/tiny.json"), {"precision.recipe=fp8mix"});
  auto backend = gnmr::make_cpu_backend(1);
  gnmr::LlamaModel model(config.model, *backend, 2, 32, config.precision);
  const nlohmann::json impls = gnmr::projection_gemm_impls(model, *backend);
  for (const char* kind : {"q", "k", "v", "o", "gate", "up", "down"}) {
    ASSERT_TRUE(impls.contains(kind)) << impls.dump();
    EXPECT_EQ(impls[kind]["low"].get<std::string>().rfind("emulated (the cpu backend", 0), 0u);
    EXPECT_TRUE(impls[kind].contains("recovery"));
  }
  EXPECT_EQ(impls["lm_head"]["recovery"], "fp32");
}

}  // namespace
