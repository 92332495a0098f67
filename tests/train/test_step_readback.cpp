// The trainer waits for the backend once per optimizer step: the micro-steps' losses, the
// clip factor and the finite flag stay in backend memory, and one readback carries the loss
// and the squared norms the controller needs. Evaluation and checkpoints add their own,
// counted here too, so a new wait anywhere shows up as a changed number.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/shard.h"
#include "test_paths.h"
#include "train/checkpoint.h"
#include "train/session.h"

namespace {

// Counter-hashed tokens below the tiny model's vocabulary (4096).
std::vector<int32_t> some_tokens(size_t count, uint32_t seed) {
  std::vector<int32_t> tokens(count);
  uint32_t x = seed;
  for (int32_t& t : tokens) {
    x = x * 1664525u + 1013904223u;
    t = int32_t((x >> 8) % 4096u);
  }
  return tokens;
}

TEST(StepReadback, ATrainingStepSynchronisesOnceEvaluationOncePerBatchCheckpointsOncePerTensor) {
  const std::string dir = gnmr_test::scratch_dir("step_readback");
  gnmr::write_shard_atomic(dir + "/train_000000.bin", some_tokens(8192, 1), 4096);
  gnmr::write_shard_atomic(dir + "/val_000000.bin", some_tokens(2048, 2), 4096);
  // 4 micro-steps of 2 × 16 tokens per optimizer step.
  gnmr::RunConfig config = gnmr::load_run_config(
      gnmr_test::source_path("configs/models/tiny.json"),
      {"data.seq_len=16", "train.micro_batch=2", "train.global_batch_tokens=128", "train.threads=1",
       "train.grad_clip=0.01", "data.train=" + dir + "/train_*.bin",
       "data.val=" + dir + "/val_*.bin"});
  gnmr::TrainingSession session(config, /*synthetic_data=*/false);
  ASSERT_EQ(session.accumulation_steps(), 4);
  const gnmr::Backend& backend = session.backend();
  EXPECT_EQ(backend.sync_count(), 0) << "building the session read something back";

  for (int64_t s = 0; s < 4; ++s) {
    const int64_t before = backend.sync_count();
    gnmr::StepResult r = session.run_step(s);
    ASSERT_FALSE(r.skipped);
    EXPECT_GT(r.grad_norm, 0.01) << "grad_clip=0.01 should clip, exercising the clip factor";
    EXPECT_EQ(backend.sync_count() - before, 1) << "step " << r.step;
  }

  // Evaluation reads each batch's mean loss: 96 tokens are 3 batches of 2 × 16.
  int64_t before = backend.sync_count();
  session.evaluate(96);
  EXPECT_EQ(backend.sync_count() - before, 3);

  // A checkpoint copies every parameter, then its two AdamW moments, one tensor at a time.
  before = backend.sync_count();
  session.save_controller_state();
  gnmr::save_checkpoint(dir + "/run", config, session.backend(), session.model(),
                        session.optimizer(), session.state());
  EXPECT_EQ(backend.sync_count() - before, int64_t(3 * session.model().params().size()));
}

}  // namespace
