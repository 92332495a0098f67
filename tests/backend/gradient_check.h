// Helpers for finite-difference gradient checks and random test data.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace gnmr {
namespace testing {

template <typename T>
std::vector<T> random_vector(size_t count, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<T> out(count);
  for (T& v : out) v = static_cast<T>(normal(rng));
  return out;
}

// Central difference (f(x + h) - f(x - h)) / 2h of `loss` at every element of `x`, compared
// with `analytic`. In double with h = 1e-6 the truncation error is O(h^2 f''') ~ 1e-12 and
// the rounding error O(eps |f| / h) ~ 1e-10, so `tolerance` (absolute, scaled by
// max(1, |analytic|)) can be ~1e-6 for O(1) functions.
inline void expect_matches_central_differences(std::vector<double>& x,
                                               const std::vector<double>& analytic,
                                               const std::function<double()>& loss,
                                               double tolerance, const char* what,
                                               double h = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    const double bound = tolerance * std::max(1.0, std::fabs(analytic[i]));
    if (std::fabs(numeric - analytic[i]) > bound && failures++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " vs numeric "
                    << numeric;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// sum_i r[i] * y[i]: the scalar whose gradient with respect to y is r.
inline double dot(const std::vector<double>& r, const std::vector<double>& y) {
  double sum = 0.0;
  for (size_t i = 0; i < r.size(); ++i) sum += r[i] * y[i];
  return sum;
}

}  // namespace testing
}  // namespace gnmr
