// make_backend, the one place a backend is made: the config's choices reach the backend, and
// a backend this binary lacks is refused with the fix.
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"
#include "expect_error.h"
#include "test_paths.h"
#include "train/make_backend.h"
#ifdef GNMR_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_probe.h"
#include "backend/flash_layout.h"
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

TEST(MakeBackend, ModelAttentionNamesTheCudaAttentionKernel) {
  EXPECT_EQ(gnmr::parse_cuda_attention("auto"), gnmr::CudaAttention::Auto);
  EXPECT_EQ(gnmr::parse_cuda_attention("flash"), gnmr::CudaAttention::Flash);
  EXPECT_EQ(gnmr::parse_cuda_attention("flash_bf16"), gnmr::CudaAttention::FlashBf16);
  EXPECT_EQ(gnmr::parse_cuda_attention("materialized"), gnmr::CudaAttention::Materialized);
  gnmr_test::expect_error([] { gnmr::parse_cuda_attention("fused"); }, gnmr::ErrorKind::Config,
                          {"\"model.attention\" is \"fused\""});
}

// What each choice saves for a layer: flash its out [B, T, H, hd] (unless the caller keeps it)
// and lse [B, H, T]; v1 the
// probabilities [B, H, T, T]; auto flash for head dims 64 and 128 and v1 for the others.
TEST(MakeBackend, CudaPlansTheAttentionThatModelAttentionChose) {
  if (!gnmr::probe_cuda_device(0).usable) GTEST_SKIP() << "no usable GPU";
  const gnmr::AttentionShape hd64{2, 128, 8, 2, 64}, hd16{2, 128, 8, 2, 16};
  const size_t flash_bytes = sizeof(float) * size_t(2 * 128 * 8 * 64 + 2 * 8 * 128);
  const size_t probs_bytes = sizeof(float) * size_t(2 * 8 * 128 * 128);
  auto auto_backend = gnmr::make_backend(tiny_config({"backend=cuda"}));
  EXPECT_EQ(auto_backend->plan_attention("a", hd64, false)->saved_bytes(), flash_bytes);
  EXPECT_EQ(auto_backend->plan_attention("b", hd16, false)->saved_bytes(), probs_bytes);
  auto v1 = gnmr::make_backend(tiny_config({"backend=cuda", "model.attention=materialized"}));
  EXPECT_EQ(v1->plan_attention("a", hd64, false)->saved_bytes(), probs_bytes);
  auto flash = gnmr::make_backend(tiny_config({"backend=cuda", "model.attention=flash"}));
  EXPECT_EQ(flash->plan_attention("a", hd64, false)->saved_bytes(), flash_bytes);
  // With the caller keeping out, flash saves only the lse; v1 its probabilities either way.
  EXPECT_EQ(flash->plan_attention("c", hd64, true)->saved_bytes(),
            sizeof(float) * size_t(2 * 8 * 128));
  EXPECT_EQ(v1->plan_attention("c", hd64, true)->saved_bytes(), probs_bytes);
  gnmr_test::expect_error([&] { flash->plan_attention("b", hd16, false); }, gnmr::ErrorKind::Config,
                          {"head dim 16 (B=2 T=128 H=8 Hkv=2 hd=16)", "materialized"});
  // The tensor-core kernels save the same tensors and the forward's bf16 copies of q, k, v
  // (their backward reads those, not q, k, v: keeps_inputs), and take the same head dims.
  auto bf16 = gnmr::make_backend(tiny_config({"backend=cuda", "model.attention=flash_bf16"}));
  const size_t bf16_qkv_bytes = 2 * size_t(2 * 128 * 8 * 64 + 2 * (2 * 128 * 2 * 64));
  EXPECT_EQ(bf16->plan_attention("a", hd64, false)->saved_bytes(), flash_bytes + bf16_qkv_bytes);
  EXPECT_TRUE(bf16->plan_attention("e", hd64, false)->keeps_inputs());
  EXPECT_FALSE(flash->plan_attention("e", hd64, false)->keeps_inputs());
  // Each names its kernels.
  EXPECT_EQ(v1->plan_attention("d", hd64, false)->kernel(),
            "materialized (cuBLASLt fp32 GEMMs + causal softmax)");
  // v1's GEMMs follow train.gemm_precision (attention_v1_compute_type).
  auto v1_bf16 = gnmr::make_backend(
      tiny_config({"backend=cuda", "model.attention=materialized", "train.gemm_precision=bf16"}));
  EXPECT_EQ(v1_bf16->plan_attention("d", hd64, false)->kernel(),
            "materialized (cuBLASLt GEMMs on bf16 tensor cores + fp32 causal softmax)");
  EXPECT_EQ(v1_bf16->plan_attention("e", hd64, false)->saved_bytes(), probs_bytes);
  EXPECT_EQ(flash->plan_attention("d", hd64, false)->kernel(), "flash (fp32 SIMT)");
  // (the tiles it names: the defaults on the emulation, timed on a GPU, where either is tested
  // in GpuFlashAttention.*)
  EXPECT_EQ(bf16->plan_attention("d", hd64, false)
                ->kernel()
                .rfind("flash_bf16 (bf16 tensor cores, mma.sync; query tiles of ", 0),
            0u);
  EXPECT_EQ(auto_backend->plan_attention("d", hd64, false)->kernel(), "flash (fp32 SIMT)");
  gnmr_test::expect_error([&] { bf16->plan_attention("b", hd16, false); }, gnmr::ErrorKind::Config,
                          {"\"flash_bf16\": head dim 16", "materialized"});
}
#else
TEST(MakeBackend, CudaIsNotInThisBuildAndTheMessageSaysWhatToUse) {
  gnmr_test::expect_error([] { gnmr::make_backend(tiny_config({"backend=cuda"})); },
                          gnmr::ErrorKind::NotBuilt,
                          {"backend \"cuda\" is not in this binary", "use backend=cpu"});
}
#endif

}  // namespace
