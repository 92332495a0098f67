// RiskMonitor: the two running statistics of every decision unit (paper; docs/DESIGN.md §3).
//
//   GNMR_t(u)   = n_t(u) / mean(n_1(u) .. n_{t-1}(u))            long horizon, all history
//   Δ-GNMR_t(u) = GNMR_t(u) / mean(GNMR_{t-δ}(u) .. GNMR_{t-1}(u))  short window δ
//
// t counts the unit's recorded observations, so GNMR is defined from the 2nd observation
// and Δ-GNMR from the (δ+2)-th. Sums are kept in double, in observation order. "All
// history" is what the caller records: the controller records nothing before
// gnmr.history_start (controller_options.h).
//
// Edge cases (documented choices):
// - A NaN, ±Inf or negative norm is "invalid": its scores are NaN, the caller treats the unit
//   as maximally risky for this step, and nothing enters the history or the window, so every
//   later score equals that of a run in which the invalid observation never happened.
// - Zero history (all previous norms 0): GNMR = 1 if n = 0, +inf if n > 0. The norm itself
//   enters the history; an infinite GNMR does not enter the Δ window (only finite GNMR values
//   do) and its Δ-GNMR is +inf. Likewise a window of all-zero GNMR values gives Δ = 1 for
//   GNMR = 0 and +inf otherwise.
// - History "capped": when GNMR > α_t (finite, mean > 0) the running mean receives α_t·mean
//   instead of n and the window receives α_t instead of GNMR (ZClip/AdaGC feed back the
//   clipped value).
//
// scripts/calibrate_gnmr.py replays these statistics in Python on a recorded trace (raw and
// capped history): a change here is a change there, and tests/scripts checks the replay
// against a run's reported exceedance rate.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "controller/controller_options.h"

namespace gnmr {

struct UnitScores {
  double norm = std::numeric_limits<double>::quiet_NaN();   // as observed
  double gnmr = std::numeric_limits<double>::quiet_NaN();   // NaN while undefined
  double delta = std::numeric_limits<double>::quiet_NaN();  // NaN while undefined
  bool norm_valid = false;
  bool gnmr_defined() const { return gnmr == gnmr; }
  bool delta_defined() const { return delta == delta; }
  // Both statistics defined: the unit can be judged by them.
  bool ready() const { return gnmr_defined() && delta_defined(); }
};

class RiskMonitor {
 public:
  RiskMonitor(int n_units, int window);

  int n_units() const { return static_cast<int>(state_.norm_count.size()); }
  int window() const { return window_; }

  // Scores norm n against unit u's history, then records it (see the header comment).
  // alpha_t matters only for HistoryMode::Capped.
  UnitScores observe(int unit, double norm, HistoryMode history, double alpha_t);

  // The scores of a norm that is shown but not recorded (steps before gnmr.history_start):
  // the norm and its validity, GNMR and Δ-GNMR undefined. No state changes.
  static UnitScores unobserved(double norm);

  // Raw state, for save/load (controller_state.cpp).
  struct State {
    std::vector<double> norm_sum;        // [n_units]
    std::vector<int64_t> norm_count;     // [n_units]
    std::vector<double> gnmr_window;     // [n_units * window], ring buffers
    std::vector<int32_t> window_filled;  // [n_units], 0..window
    std::vector<int32_t> window_next;    // [n_units], next slot to write
  };
  const State& state() const { return state_; }
  // Throws std::invalid_argument when the sizes do not match this monitor.
  void set_state(State state);

 private:
  double window_mean(int unit) const;

  int window_;
  State state_;
};

}  // namespace gnmr
