#include <gtest/gtest.h>

#include <cmath>

#include "train/lr_schedule.h"

TEST(LearningRateSchedule, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
  gnmr::TrainConfig t;
  t.lr = 1.0;
  t.min_lr_ratio = 0.1;
  t.warmup_steps = 10;
  t.steps = 110;
  EXPECT_DOUBLE_EQ(gnmr::learning_rate_at(t, 0), 0.1);
  EXPECT_DOUBLE_EQ(gnmr::learning_rate_at(t, 9), 1.0);
  EXPECT_DOUBLE_EQ(gnmr::learning_rate_at(t, 10), 1.0);           // cosine starts at the peak
  EXPECT_NEAR(gnmr::learning_rate_at(t, 60), 0.1 + 0.45, 1e-12);  // halfway: mean of peak and floor
  EXPECT_NEAR(gnmr::learning_rate_at(t, 110), 0.1, 1e-12);        // the floor
  for (int s = 11; s < 110; ++s)
    EXPECT_LT(gnmr::learning_rate_at(t, s), gnmr::learning_rate_at(t, s - 1));
}

TEST(LearningRateSchedule, NoWarmupStartsAtThePeak) {
  gnmr::TrainConfig t;
  t.lr = 2.0;
  t.warmup_steps = 0;
  t.steps = 10;
  EXPECT_DOUBLE_EQ(gnmr::learning_rate_at(t, 0), 2.0);
}
