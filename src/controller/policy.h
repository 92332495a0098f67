// The budgeted recovery policy (paper; docs/DESIGN.md §3) and the budget filler that the
// baselines share.
//
// At each observation, for decision unit u with scores from the RiskMonitor:
//   risky(u)     = GNMR > α_t or Δ-GNMR > β_t, or the norm is invalid (NaN/Inf: risk +inf);
//                  only units whose statistics are defined (ready) and only once
//                  step >= warmup_steps
//   candidate(u) = risky(u) or lock(u) > 0
//   active set   = candidates in order of decreasing risk (ties: lower unit id first), taken
//                  while the budget and the per-kind caps allow (BudgetFiller)
// Lock update, after selection:
//   selected and risky   -> lock = T_lock   (set, or refreshed while the unit stays risky)
//   calm and lock > 0    -> lock -= 1       (whether or not it was selected: a locked unit
//                                            squeezed out by riskier ones still counts down)
//   risky, not selected  -> lock unchanged
// So lock = the number of further calm observations for which the unit stays a candidate:
// a unit that spikes once at observation t is in the plans returned at t, t+1, .., t+T_lock
// (the spike plus T_lock calm steps) and is released by the plan returned at t+T_lock+1.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "controller/controller_options.h"
#include "controller/monitor.h"
#include "controller/units.h"

namespace gnmr {

struct Thresholds {
  double alpha;
  double beta;
};

// α_t, β_t: constant, or from (alpha, beta) to (alpha_final, beta_final) over
// p = clamp(step / schedule_steps, 0, 1): linear a + (a_f - a)·p, cosine
// a_f + (a - a_f)·(1 + cos(π·p)) / 2.
Thresholds thresholds_at(const ControllerOptions& options, int64_t step);

// Risk of a decision unit for ranking; +inf for an invalid norm. Undefined scores count as 0.
// use_delta = false (gnmr_no_delta) drops the Δ term (β = ∞).
double risk_score(RankingKey ranking, const UnitScores& scores, Thresholds thresholds,
                  bool use_delta);

// Fills the budget (in projection units) with decision units offered in priority order.
// A decision unit is taken only if all its members fit in the remaining budget and no
// member's kind would exceed its per-kind cap; otherwise it is skipped and smaller ones may
// still fit. The active count therefore never exceeds the budget.
// PINNED ([n_decision_units], or null) marks units that are on recovery outside the budget
// (precision.recovery_layers): never taken, so they cost no budget.
class BudgetFiller {
 public:
  BudgetFiller(const DecisionUnits& units, int budget,
               const std::array<int, kKindsPerLayer>& per_kind_cap,
               const std::vector<uint8_t>* pinned = nullptr);

  // Returns whether decision unit d was taken.
  bool offer(int decision);
  bool full() const { return used_ >= budget_; }
  int used() const { return used_; }

 private:
  const DecisionUnits& units_;
  int budget_;
  const std::vector<uint8_t>* pinned_;
  int used_ = 0;
  std::array<int, kKindsPerLayer> per_kind_cap_;
  std::array<int, kKindsPerLayer> per_kind_used_{};
};

// Sorts decision unit ids by decreasing key, ties by increasing id (deterministic).
void sort_by_priority(std::vector<int>& decisions, const std::vector<double>& key);

struct PolicyInputs {
  const std::vector<UnitScores>* scores;  // [n_decision_units]
  const std::vector<uint8_t>* eligible;   // [n_decision_units]: may be judged this step
  Thresholds thresholds;
  bool use_delta;
  RankingKey ranking;
};

struct PolicyResult {
  std::vector<uint8_t> risky;      // [n_decision_units]
  std::vector<uint8_t> candidate;  // [n_decision_units]
  std::vector<uint8_t> selected;   // [n_decision_units]
  std::vector<double> risk;        // [n_decision_units], for every unit
};

// Classifies every decision unit: risky, candidate (risky or locked) and risk. Every
// controller runs this, so telemetry is comparable across baselines.
void assess_units(const PolicyInputs& inputs, const std::vector<int32_t>& locks,
                  PolicyResult& result);

// GNMR selection: candidates by decreasing risk (ties: lower id) offered to the filler.
void select_candidates(BudgetFiller& filler, PolicyResult& result);

// The lock update above, with lock_steps = T_lock (0 for gnmr_no_lock).
void update_locks(const PolicyResult& result, int lock_steps, std::vector<int32_t>& locks);

}  // namespace gnmr
