#include "controller/monitor.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace gnmr {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// a / b with the zero-history convention: 0/0 = 1, x/0 = +inf for x > 0.
double ratio_to_mean(double value, double mean) {
  if (mean > 0.0) return value / mean;
  return value == 0.0 ? 1.0 : kInf;
}
}  // namespace

RiskMonitor::RiskMonitor(int n_units, int window) : window_(window) {
  const size_t n = static_cast<size_t>(n_units);
  state_.norm_sum.assign(n, 0.0);
  state_.norm_count.assign(n, 0);
  state_.gnmr_window.assign(n * static_cast<size_t>(window), 0.0);
  state_.window_filled.assign(n, 0);
  state_.window_next.assign(n, 0);
}

double RiskMonitor::window_mean(int unit) const {
  // Chronological order (oldest first), so the sum does not depend on the ring position.
  const double* ring = &state_.gnmr_window[static_cast<size_t>(unit) * window_];
  const int next = state_.window_next[unit];
  double sum = 0.0;
  for (int i = 0; i < window_; ++i) sum += ring[(next + i) % window_];
  return sum / window_;
}

UnitScores RiskMonitor::unobserved(double norm) {
  UnitScores scores;
  scores.norm = norm;
  scores.norm_valid = std::isfinite(norm) && norm >= 0.0;
  return scores;
}

UnitScores RiskMonitor::observe(int unit, double norm, HistoryMode history, double alpha_t) {
  UnitScores scores = unobserved(norm);
  if (!scores.norm_valid) return scores;  // history and window untouched

  double& sum = state_.norm_sum[unit];
  int64_t& count = state_.norm_count[unit];
  int32_t& filled = state_.window_filled[unit];
  double recorded_norm = norm;
  if (count > 0) {
    const double mean = sum / static_cast<double>(count);
    scores.gnmr = ratio_to_mean(norm, mean);  // GNMR_t = n_t / mean(n_1..n_{t-1})
    if (filled == window_) {
      // Δ-GNMR_t = GNMR_t / mean(GNMR_{t-δ}..GNMR_{t-1})
      scores.delta = std::isinf(scores.gnmr) ? kInf : ratio_to_mean(scores.gnmr, window_mean(unit));
    }
    if (std::isfinite(scores.gnmr)) {
      double recorded_gnmr = scores.gnmr;
      if (history == HistoryMode::Capped && scores.gnmr > alpha_t) {
        recorded_norm = alpha_t * mean;
        recorded_gnmr = alpha_t;
      }
      int32_t& next = state_.window_next[unit];
      state_.gnmr_window[static_cast<size_t>(unit) * window_ + next] = recorded_gnmr;
      next = (next + 1) % window_;
      if (filled < window_) ++filled;
    }
  }
  sum += recorded_norm;
  ++count;
  return scores;
}

void RiskMonitor::set_state(State state) {
  const size_t n = state_.norm_count.size();
  if (state.norm_sum.size() != n || state.norm_count.size() != n ||
      state.window_filled.size() != n || state.window_next.size() != n ||
      state.gnmr_window.size() != n * static_cast<size_t>(window_)) {
    throw std::invalid_argument("gnmr controller state: monitor sizes do not match " +
                                std::to_string(n) + " decision units with window " +
                                std::to_string(window_));
  }
  for (size_t u = 0; u < n; ++u) {
    if (state.window_filled[u] < 0 || state.window_filled[u] > window_ ||
        state.window_next[u] < 0 || state.window_next[u] >= window_ || state.norm_count[u] < 0) {
      throw std::invalid_argument("gnmr controller state: corrupt monitor window of unit " +
                                  std::to_string(u));
    }
  }
  state_ = std::move(state);
}

}  // namespace gnmr
