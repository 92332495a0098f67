// GNMR_POISON=1 (make_backend): activations, saved activations and scratch start as NaN bytes
// instead of zeros. A model that reads any of them before an op wrote it would train
// differently (or to NaN), so each recipe's losses must be the same bits with and without it.
// The CUDA backend's twin of this test is tests/gpu/test_gpu_training.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "test_paths.h"
#include "train/session.h"

namespace {

std::vector<double> losses(const std::vector<std::string>& recipe, bool poison) {
  std::vector<std::string> overrides = {
      "data.seq_len=32", "train.micro_batch=2", "train.global_batch_tokens=128", "train.steps=4",
      "train.warmup_steps=1", "train.threads=2",
      // routes units from step 3, so both paths run
      "gnmr.controller=gnmr", "gnmr.max_active=0.25", "gnmr.window=2", "gnmr.lock_steps=1",
      "gnmr.warmup_steps=2", "gnmr.history_start=1"};
  overrides.insert(overrides.end(), recipe.begin(), recipe.end());
  const gnmr::RunConfig config =
      gnmr::load_run_config(gnmr_test::source_path("configs/models/tiny.json"), overrides);
  if (poison) {
    EXPECT_EQ(setenv("GNMR_POISON", "1", 1), 0);
  }
  gnmr::TrainingSession session(config, /*synthetic_data=*/true);
  if (poison) unsetenv("GNMR_POISON");
  std::vector<double> out;
  for (int64_t s = 0; s < 4; ++s) out.push_back(session.run_step(s).loss);
  return out;
}

TEST(PoisonMode, EveryRecipeTrainsToTheSameBitsWhenUnwrittenMemoryIsNaN) {
  const std::vector<std::vector<std::string>> recipes = {
      {"precision.recipe=fp32"},
      {"precision.recipe=bf16", "train.gemm_precision=bf16"},
      {"precision.recipe=actq"},
      {"precision.recipe=fp8mix"},
      {"precision.recipe=int8"}};
  for (const auto& recipe : recipes) {
    const std::vector<double> clean = losses(recipe, false), poisoned = losses(recipe, true);
    ASSERT_EQ(clean.size(), poisoned.size());
    for (size_t s = 0; s < clean.size(); ++s) {
      EXPECT_EQ(std::memcmp(&clean[s], &poisoned[s], sizeof(double)), 0)
          << recipe[0] << " step " << s + 1 << ": " << clean[s] << " vs poisoned " << poisoned[s];
    }
  }
}

}  // namespace
