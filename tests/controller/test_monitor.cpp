// Hand-computed traces of the RiskMonitor (GNMR, Δ-GNMR; docs/DESIGN.md §3) and its edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "controller/monitor.h"
#include "controller/units.h"

namespace gnmr {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

UnitScores feed(RiskMonitor& m, double norm, HistoryMode history = HistoryMode::Raw,
                double alpha = 1.5) {
  return m.observe(0, norm, history, alpha);
}

TEST(GnmrMonitor, NormsOneOneOneFourGiveGnmrFourAndDeltaFour) {
  RiskMonitor m(1, 2);
  UnitScores s1 = feed(m, 1.0);
  EXPECT_FALSE(s1.gnmr_defined());  // no history yet
  EXPECT_FALSE(s1.delta_defined());
  UnitScores s2 = feed(m, 1.0);
  EXPECT_EQ(s2.gnmr, 1.0);
  EXPECT_FALSE(s2.delta_defined());  // window holds 0 of 2 GNMR values
  UnitScores s3 = feed(m, 1.0);
  EXPECT_EQ(s3.gnmr, 1.0);
  EXPECT_FALSE(s3.delta_defined());  // 1 of 2
  UnitScores s4 = feed(m, 4.0);
  EXPECT_EQ(s4.gnmr, 4.0);   // 4 / mean(1,1,1)
  EXPECT_EQ(s4.delta, 4.0);  // 4 / mean(GNMR_2, GNMR_3) = 4 / 1
  EXPECT_TRUE(s4.ready());
}

TEST(GnmrMonitor, DeltaIsFirstDefinedAtObservationWindowPlusTwoAndSlides) {
  // δ = 3, norms 2, 4, 2, 6, 7, 1.
  RiskMonitor m(1, 3);
  EXPECT_FALSE(feed(m, 2.0).gnmr_defined());
  const double g2 = 4.0 / (2.0 / 1.0);
  const double g3 = 2.0 / (6.0 / 2.0);
  const double g4 = 6.0 / (8.0 / 3.0);
  const double g5 = 7.0 / (14.0 / 4.0);
  const double g6 = 1.0 / (21.0 / 5.0);
  UnitScores s2 = feed(m, 4.0), s3 = feed(m, 2.0), s4 = feed(m, 6.0);
  EXPECT_DOUBLE_EQ(s2.gnmr, g2);
  EXPECT_DOUBLE_EQ(s3.gnmr, g3);
  EXPECT_DOUBLE_EQ(s4.gnmr, g4);
  EXPECT_FALSE(s4.delta_defined());  // observation 4 < δ + 2 = 5
  UnitScores s5 = feed(m, 7.0);
  EXPECT_DOUBLE_EQ(s5.gnmr, g5);
  EXPECT_DOUBLE_EQ(s5.delta, g5 / ((g2 + g3 + g4) / 3.0));  // first defined: exactly δ values
  UnitScores s6 = feed(m, 1.0);
  EXPECT_DOUBLE_EQ(s6.gnmr, g6);
  EXPECT_DOUBLE_EQ(s6.delta, g6 / ((g3 + g4 + g5) / 3.0));  // oldest value (g2) dropped
}

TEST(GnmrMonitor, MatchesTheFormulaOnALongRandomStream) {
  const int window = 5;
  RiskMonitor m(1, window);
  std::mt19937 rng(7);
  std::lognormal_distribution<double> dist(0.0, 0.5);
  std::vector<double> norms, gnmrs;
  for (int t = 0; t < 300; ++t) {
    const double n = dist(rng);
    UnitScores s = feed(m, n);
    if (!norms.empty()) {
      double sum = 0.0;
      for (double x : norms) sum += x;
      const double gnmr = n / (sum / norms.size());
      EXPECT_DOUBLE_EQ(s.gnmr, gnmr) << "t=" << t;
      if (gnmrs.size() >= static_cast<size_t>(window)) {
        double window_sum = 0.0;
        for (size_t i = gnmrs.size() - window; i < gnmrs.size(); ++i) window_sum += gnmrs[i];
        EXPECT_DOUBLE_EQ(s.delta, gnmr / (window_sum / window)) << "t=" << t;
      } else {
        EXPECT_FALSE(s.delta_defined());
      }
      gnmrs.push_back(gnmr);
    }
    norms.push_back(n);
  }
}

TEST(GnmrMonitor, InvalidNormsLeaveHistoryAsIfTheyNeverHappened) {
  const std::vector<double> clean = {1.0, 2.0, 1.5, 1.0, 3.0, 0.5, 1.0, 1.2, 0.9, 2.2};
  RiskMonitor with_invalid(1, 3), without(1, 3);
  for (size_t i = 0; i < clean.size(); ++i) {
    if (i == 2) {
      for (double bad : {kNaN, kInf, -kInf, -1.0}) {
        UnitScores s = feed(with_invalid, bad);
        EXPECT_FALSE(s.norm_valid);
        EXPECT_FALSE(s.gnmr_defined());
        EXPECT_FALSE(s.delta_defined());
      }
    }
    UnitScores a = feed(with_invalid, clean[i]);
    UnitScores b = feed(without, clean[i]);
    // Bitwise identical, NaN (undefined) included.
    EXPECT_EQ(std::isnan(a.gnmr), std::isnan(b.gnmr));
    if (!std::isnan(b.gnmr)) {
      EXPECT_EQ(a.gnmr, b.gnmr) << "i=" << i;
    }
    if (!std::isnan(b.delta)) {
      EXPECT_EQ(a.delta, b.delta) << "i=" << i;
    }
  }
  EXPECT_EQ(with_invalid.state().norm_sum, without.state().norm_sum);
  EXPECT_EQ(with_invalid.state().norm_count, without.state().norm_count);
  EXPECT_EQ(with_invalid.state().gnmr_window, without.state().gnmr_window);
}

TEST(GnmrMonitor, ZeroHistoryGivesOneForZeroAndInfinityOtherwiseWithoutEnteringTheWindow) {
  RiskMonitor m(1, 2);
  feed(m, 0.0);
  EXPECT_EQ(feed(m, 0.0).gnmr, 1.0);  // 0 / mean(0): defined as 1
  EXPECT_EQ(feed(m, 0.0).gnmr, 1.0);
  UnitScores spike = feed(m, 5.0);  // 5 / mean(0,0,0)
  EXPECT_EQ(spike.gnmr, kInf);
  EXPECT_EQ(spike.delta, kInf);
  // The 5 entered the history (mean 5/4), the infinite GNMR did not enter the window,
  // which still holds GNMR_2 = GNMR_3 = 1.
  UnitScores next = feed(m, 5.0);
  EXPECT_EQ(next.gnmr, 4.0);
  EXPECT_EQ(next.delta, 4.0);
  for (double value : m.state().gnmr_window) EXPECT_TRUE(std::isfinite(value));
}

TEST(GnmrMonitor, CappedHistoryFeedsBackAlphaTimesMean) {
  RiskMonitor raw(1, 2), capped(1, 2);
  for (double n : {1.0, 1.0, 1.0}) {
    feed(raw, n, HistoryMode::Raw);
    feed(capped, n, HistoryMode::Capped);
  }
  // The spike itself scores the same in both modes ...
  EXPECT_EQ(feed(raw, 10.0, HistoryMode::Raw).gnmr, 10.0);
  EXPECT_EQ(feed(capped, 10.0, HistoryMode::Capped).gnmr, 10.0);
  // ... but the capped history recorded 1.5 * mean = 1.5 and a GNMR of 1.5.
  UnitScores r = feed(raw, 1.0, HistoryMode::Raw);
  UnitScores c = feed(capped, 1.0, HistoryMode::Capped);
  EXPECT_DOUBLE_EQ(r.gnmr, 1.0 / (13.0 / 4.0));
  EXPECT_DOUBLE_EQ(c.gnmr, 1.0 / (4.5 / 4.0));
  EXPECT_DOUBLE_EQ(r.delta, r.gnmr / ((1.0 + 10.0) / 2.0));
  EXPECT_DOUBLE_EQ(c.delta, c.gnmr / ((1.0 + 1.5) / 2.0));
}

TEST(GnmrMonitor, UnitsAreIndependent) {
  RiskMonitor m(2, 2);
  for (int t = 0; t < 5; ++t) {
    m.observe(0, 1.0, HistoryMode::Raw, 1.5);
    m.observe(1, 100.0 * (t + 1), HistoryMode::Raw, 1.5);
  }
  EXPECT_EQ(m.observe(0, 4.0, HistoryMode::Raw, 1.5).gnmr, 4.0);
}

TEST(DecisionUnits, UnitIdIsLayerTimesSevenPlusKind) {
  EXPECT_EQ(unit_id(0, ProjectionKind::Q), 0);
  EXPECT_EQ(unit_id(2, ProjectionKind::Down), 20);
  EXPECT_EQ(unit_layer(20), 2);
  EXPECT_EQ(unit_kind(20), ProjectionKind::Down);
  EXPECT_STREQ(projection_kind_name(ProjectionKind::Gate), "gate");
  EXPECT_EQ(projection_kind_from_name("up"), ProjectionKind::Up);
  EXPECT_FALSE(projection_kind_from_name("mlp").has_value());
}

TEST(DecisionUnits, GroupsAreAttentionThenMlpAndTheirNormIsTheL2OfMembers) {
  DecisionUnits groups(2, Granularity::Group);
  ASSERT_EQ(groups.n_decision_units(), 4);
  EXPECT_EQ(groups.members(0), (std::vector<UnitId>{0, 1, 2, 3}));
  EXPECT_EQ(groups.members(3), (std::vector<UnitId>{11, 12, 13}));
  EXPECT_EQ(groups.decision_of(12), 3);
  std::vector<float> norms = {1, 1, 1, 1, 2, 3, 6, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(groups.decision_norm(0, norms.data()), 2.0);  // sqrt(4 * 1)
  EXPECT_EQ(groups.decision_norm(1, norms.data()), 7.0);  // sqrt(4 + 9 + 36)
  norms[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(groups.decision_norm(1, norms.data())));
  DecisionUnits projections(2, Granularity::Projection);
  EXPECT_EQ(projections.n_decision_units(), 14);
  EXPECT_EQ(projections.decision_norm(6, norms.data()), 6.0);
}

}  // namespace
}  // namespace gnmr
