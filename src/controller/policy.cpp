#include "controller/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gnmr {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;

double defined_or_zero(double value) {
  return value == value ? value : 0.0;
}
}  // namespace

Thresholds thresholds_at(const ControllerOptions& options, int64_t step) {
  const double alpha_final = std::isnan(options.alpha_final) ? options.alpha : options.alpha_final;
  const double beta_final = std::isnan(options.beta_final) ? options.beta : options.beta_final;
  if (options.threshold_schedule == "constant" || options.schedule_steps < 1) {
    return {options.alpha, options.beta};
  }
  double p = static_cast<double>(step) / static_cast<double>(options.schedule_steps);
  p = std::min(1.0, std::max(0.0, p));
  double w;  // weight of the final value
  if (options.threshold_schedule == "linear") {
    w = p;
  } else {
    w = 1.0 - (1.0 + std::cos(kPi * p)) / 2.0;
  }
  return {options.alpha + (alpha_final - options.alpha) * w,
          options.beta + (beta_final - options.beta) * w};
}

double risk_score(RankingKey ranking, const UnitScores& scores, Thresholds thresholds,
                  bool use_delta) {
  if (!scores.norm_valid) return kInf;
  const double gnmr = defined_or_zero(scores.gnmr);
  const double delta = use_delta ? defined_or_zero(scores.delta) : 0.0;
  switch (ranking) {
    case RankingKey::MaxRatio:
      return std::max(gnmr / thresholds.alpha, delta / thresholds.beta);
    case RankingKey::SumRatio:
      return gnmr / thresholds.alpha + delta / thresholds.beta;
    case RankingKey::Gnmr:
      return gnmr;
    case RankingKey::Delta:
      return delta;
  }
  return 0.0;
}

BudgetFiller::BudgetFiller(const DecisionUnits& units, int budget,
                           const std::array<int, kKindsPerLayer>& per_kind_cap,
                           const std::vector<uint8_t>* pinned)
    : units_(units), budget_(budget), pinned_(pinned), per_kind_cap_(per_kind_cap) {}

bool BudgetFiller::offer(int decision) {
  if (pinned_ && (*pinned_)[decision]) return false;
  const std::vector<UnitId>& members = units_.members(decision);
  if (used_ + static_cast<int>(members.size()) > budget_) return false;
  std::array<int, kKindsPerLayer> kind_used = per_kind_used_;
  for (UnitId unit : members) {
    const int kind = static_cast<int>(unit_kind(unit));
    if (++kind_used[kind] > per_kind_cap_[kind]) return false;
  }
  per_kind_used_ = kind_used;
  used_ += static_cast<int>(members.size());
  return true;
}

void sort_by_priority(std::vector<int>& decisions, const std::vector<double>& key) {
  std::sort(decisions.begin(), decisions.end(), [&key](int a, int b) {
    if (key[a] != key[b]) return key[a] > key[b];
    return a < b;
  });
}

void assess_units(const PolicyInputs& inputs, const std::vector<int32_t>& locks,
                  PolicyResult& result) {
  const std::vector<UnitScores>& scores = *inputs.scores;
  const size_t n = scores.size();
  const double beta = inputs.use_delta ? inputs.thresholds.beta : kInf;
  result.risky.assign(n, 0);
  result.candidate.assign(n, 0);
  result.selected.assign(n, 0);
  result.risk.resize(n);
  for (size_t u = 0; u < n; ++u) {
    const UnitScores& s = scores[u];
    if ((*inputs.eligible)[u]) {
      // NaN comparisons are false, so undefined scores are never over a threshold.
      result.risky[u] = !s.norm_valid || s.gnmr > inputs.thresholds.alpha || s.delta > beta;
    }
    result.candidate[u] = result.risky[u] || locks[u] > 0;
    result.risk[u] = risk_score(inputs.ranking, s, inputs.thresholds, inputs.use_delta);
  }
}

void select_candidates(BudgetFiller& filler, PolicyResult& result) {
  std::vector<int> candidates;
  for (size_t u = 0; u < result.candidate.size(); ++u) {
    if (result.candidate[u]) candidates.push_back(static_cast<int>(u));
  }
  sort_by_priority(candidates, result.risk);
  for (int u : candidates) {
    if (filler.full()) break;
    result.selected[u] = filler.offer(u);
  }
}

void update_locks(const PolicyResult& result, int lock_steps, std::vector<int32_t>& locks) {
  for (size_t u = 0; u < locks.size(); ++u) {
    if (result.risky[u]) {
      if (result.selected[u]) locks[u] = lock_steps;
    } else if (locks[u] > 0) {
      --locks[u];
    }
  }
}

}  // namespace gnmr
