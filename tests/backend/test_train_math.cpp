// The per-element training math shared by the CPU twins and the CUDA kernels
// (backend/train_math.h): the finite test the skip decision rests on, the vectorizable exp's
// accuracy and its clamps, and the AdamW element against the update written out in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/train_math.h"

namespace gnmr {
namespace {

TEST(TrainMath, IsFiniteDoubleAgreesWithStdIsfinite) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double x : {0.0, -0.0, 1.0, -3.5e300, std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::denorm_min(), inf, -inf,
                   std::numeric_limits<double>::quiet_NaN(), -std::nan("")}) {
    EXPECT_EQ(is_finite_double(x), std::isfinite(x)) << x;
  }
}

TEST(TrainMath, ExpVectorizableIsWithinThreeUlpAndClampsMonotonically) {
  float worst_ulps = 0.0f;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double exact = std::exp(static_cast<double>(x));
    const float ulp =
        std::nextafter(static_cast<float>(exact), INFINITY) - static_cast<float>(exact);
    worst_ulps =
        std::fmax(worst_ulps, static_cast<float>(std::fabs(exp_vectorizable(x) - exact) / ulp));
  }
  EXPECT_LE(worst_ulps, 3.0f);
  EXPECT_EQ(exp_vectorizable(0.0f), 1.0f);
  // Below -87 it holds e^-87 (the softmax and sigmoid only need monotone underflow).
  EXPECT_EQ(exp_vectorizable(-200.0f), exp_vectorizable(-87.0f));
  EXPECT_GT(exp_vectorizable(-87.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(exp_vectorizable(1000.0f)));
  // A NaN passes through, so a NaN logit cannot vanish into the clamp as e^88.
  EXPECT_TRUE(std::isnan(exp_vectorizable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_vectorizable(-std::numeric_limits<float>::quiet_NaN())));
}

TEST(TrainMath, AdamwElementMatchesTheUpdateInDouble) {
  AdamWStep s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  s.step = 4;
  const AdamWCoefficients c = adamw_coefficients(s);
  float p = 0.5f, m = 0.02f, v = 0.003f;
  adamw_update_element(p, 0.4f, m, v, 0.5f, c);
  const double g = 0.2, md = 0.9 * 0.02 + 0.1 * g, vd = 0.95 * 0.003 + 0.05 * g * g;
  const double bias1 = 1 - std::pow(0.9, 4), bias2 = 1 - std::pow(0.95, 4);
  const double pd =
      0.5 * (1 - 1e-3) - 1e-2 / bias1 * md / (std::sqrt(vd) / std::sqrt(bias2) + 1e-8);
  EXPECT_NEAR(m, md, 1e-7);
  EXPECT_NEAR(v, vd, 1e-8);
  EXPECT_NEAR(p, pd, 1e-6);  // f32 arithmetic: a few ulp of 0.49
}

}  // namespace
}  // namespace gnmr
