// The training session with the controller in the loop (synthetic tokens: fast and data-free).
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "expect_error.h"
#include "test_paths.h"
#include "train/session.h"

namespace {

gnmr::RunConfig tiny_config(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"data.seq_len=16", "train.micro_batch=2",
                                  "train.global_batch_tokens=32", "train.threads=1",
                                  "train.warmup_steps=2"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return gnmr::load_run_config(gnmr_test::source_path("configs/models/tiny.json"), all);
}

}  // namespace

TEST(SessionController, InjectedSpikeIsRecoveredNextStepAndReleasedAfterLockSteps) {
  // Unit 5 (layer 0, up projection) shows a 1000x norm at step 20. With T_lock = 3 the unit
  // is in the plans returned after steps 20..23 (the lock counts 3, 2, 1, 0 over the calm
  // steps 21..23) and released by the plan returned after step 24. Thresholds of 5 keep
  // ordinary early-training fluctuations from competing with the locked unit for the budget.
  auto config =
      tiny_config({"gnmr.controller=gnmr", "gnmr.max_active=2", "gnmr.warmup_steps=5",
                   "gnmr.alpha=5", "gnmr.beta=5", "gnmr.window=4", "gnmr.lock_steps=3",
                   "debug.spike_unit=5", "debug.spike_steps=[20]", "debug.spike_scale=1000"});
  gnmr::TrainingSession session(config, /*synthetic_data=*/true);
  for (int64_t s = 0; s < 26; ++s) {
    gnmr::StepResult r = session.run_step(s);
    ASSERT_FALSE(r.skipped);
    const auto& plan = session.controller().current_plan();
    EXPECT_LE(plan.active_count(), 2) << "budget exceeded after step " << r.step;
    const bool recovered = plan.path[5] == gnmr::Path::Recovery;
    if (r.step < 20) {
      EXPECT_FALSE(recovered) << "after step " << r.step;
    } else if (r.step <= 23) {
      EXPECT_TRUE(recovered) << "after step " << r.step;
    } else {
      EXPECT_FALSE(recovered) << "unit 5 should be released after step 24";
    }
  }
}

TEST(SessionController, StaticHighRecoversEveryUnitAndTelemetryIsRecorded) {
  auto config = tiny_config({"gnmr.controller=static_high"});
  gnmr::TrainingSession session(config, true);
  gnmr::StepResult first = session.run_step(0);
  EXPECT_EQ(first.units_recovery, 14);  // 2 layers × 7 projections
  EXPECT_TRUE(first.controller_fields.contains("active_units"));
  EXPECT_EQ(first.unit_grad_norms.size(), 14u);
  for (float n : first.unit_grad_norms) EXPECT_TRUE(std::isfinite(n) && n > 0);
}

TEST(SessionController, ControllerStateRoundTripsThroughTheSession) {
  auto config = tiny_config({"gnmr.controller=gnmr", "gnmr.warmup_steps=2", "gnmr.window=2"});
  gnmr::TrainingSession a(config, true), b(config, true);
  for (int64_t s = 0; s < 8; ++s) a.run_step(s);
  a.save_controller_state();
  b.state().controller_state = a.state().controller_state;
  b.restore_controller_state("a");
  EXPECT_EQ(a.controller().current_plan(), b.controller().current_plan());
  EXPECT_EQ(a.controller().save_state(), b.controller().save_state());
}

TEST(SessionController, ADamagedControllerStateIsNamedAndNotBlamedOnTheOptions) {
  auto config = tiny_config({"gnmr.controller=gnmr"});
  gnmr::TrainingSession source(config, true), target(config, true);
  for (int64_t s = 0; s < 3; ++s) source.run_step(s);
  source.save_controller_state();
  const std::vector<uint8_t> blob = source.state().controller_state;

  std::vector<std::vector<uint8_t>> damaged = {blob, {blob.begin(), blob.begin() + 40}, blob};
  damaged[0][blob.size() / 2] ^= 0x10;  // bit flip
  damaged[2][0] = 'X';                  // bad magic
  for (const auto& bad : damaged) {
    target.state().controller_state = bad;
    try {
      target.restore_controller_state("runs/x/checkpoints/step_00000003");
      ADD_FAILURE() << "a damaged controller state was accepted";
    } catch (const gnmr::Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.kind(), gnmr::ErrorKind::Checkpoint);
      EXPECT_NE(
          message.find("checkpoint runs/x/checkpoints/step_00000003: controller.bin is damaged"),
          std::string::npos)
          << message;
      EXPECT_EQ(message.find("options"), std::string::npos) << message;
    }
  }

  gnmr::TrainingSession other(tiny_config({"gnmr.controller=gnmr", "gnmr.alpha=5"}), true);
  other.state().controller_state = blob;
  gnmr_test::expect_error(
      [&] { other.restore_controller_state("runs/x/checkpoints/step_00000003"); },
      gnmr::ErrorKind::Checkpoint,
      {"controller.bin was saved under other gnmr.* options", "gnmr.alpha differs"});
}
