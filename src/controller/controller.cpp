#include "controller/controller.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "controller/baselines.h"

namespace gnmr {

namespace {

int checked_layers(int n_layers) {
  if (n_layers < 1) {
    throw std::invalid_argument("gnmr controller: the model needs at least 1 layer (got " +
                                std::to_string(n_layers) + ")");
  }
  return n_layers;
}

const ControllerOptions& validated(const ControllerOptions& options, int n_layers) {
  validate_controller_options(options);
  validate_budget(options.max_active, checked_layers(n_layers) * kKindsPerLayer);
  return options;
}

}  // namespace

Controller::Controller(const ControllerOptions& options, int n_layers,
                       const std::vector<int>& pinned_layers)
    : options_(validated(options, n_layers)),
      kind_(parse_controller_kind(options.controller)),
      ranking_(parse_ranking_key(options.ranking)),
      history_(parse_history_mode(options.history)),
      units_(checked_layers(n_layers), parse_granularity(options.granularity)),
      budget_(resolve_budget(options.max_active, units_.n_units())),
      per_kind_cap_(resolve_per_kind_caps(options.per_kind_cap)),
      monitor_(units_.n_decision_units(), options.window),
      locks_(static_cast<size_t>(units_.n_decision_units()), 0),
      run_telemetry_(units_.n_units()) {
  pinned_.assign(static_cast<size_t>(units_.n_decision_units()), 0);
  for (int layer : pinned_layers) {
    if (layer < -n_layers || layer >= n_layers) {
      throw std::invalid_argument("\"precision.recovery_layers\" holds " + std::to_string(layer) +
                                  ", not a layer of this " + std::to_string(n_layers) +
                                  "-layer model");
    }
    const int l = layer < 0 ? n_layers + layer : layer;
    for (int kind = 0; kind < kKindsPerLayer; ++kind)
      pinned_[units_.decision_of(l * kKindsPerLayer + kind)] = 1;
  }
  current_plan_ = initial_plan();
}

RoutingPlan Controller::all_paths(Path path) const {
  RoutingPlan plan;
  plan.path.assign(static_cast<size_t>(units_.n_units()), path);
  return plan;
}

bool Controller::uses_gnmr_policy() const {
  return kind_ == ControllerKind::Gnmr || kind_ == ControllerKind::GnmrNoDelta ||
         kind_ == ControllerKind::GnmrNoLock;
}

RoutingPlan Controller::initial_plan() const {
  return all_paths(kind_ == ControllerKind::StaticHigh ? Path::Recovery : Path::Low);
}

void Controller::set_recovery_gaps(const std::vector<float>& gaps) {
  if (gaps.size() != static_cast<size_t>(units_.n_units())) {
    throw std::invalid_argument("gnmr controller: set_recovery_gaps got " +
                                std::to_string(gaps.size()) + " gaps for " +
                                std::to_string(units_.n_units()) + " units");
  }
  gaps_.assign(gaps.begin(), gaps.end());
}

double Controller::decision_gap(int decision) const {
  double gap = 0.0;
  for (UnitId unit : units_.members(decision)) {
    const double g = gaps_[unit];
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    gap = std::max(gap, g);
  }
  return gap;
}

int64_t Controller::first_selecting_step() const {
  switch (kind_) {
    case ControllerKind::StaticLow:
    case ControllerKind::StaticHigh:
      return std::numeric_limits<int64_t>::max();
    case ControllerKind::Random:
    case ControllerKind::TopkNorm:
    case ControllerKind::Oracle:
      return std::max<int64_t>(options_.warmup_steps, 1);
    case ControllerKind::Gnmr:
    case ControllerKind::GnmrNoDelta:
    case ControllerKind::GnmrNoLock:
      break;
  }
  // RiskMonitor::observe: GNMR from the second observed norm, Δ-GNMR once `window` GNMR values
  // fill its ring; UnitScores::ready needs both.
  const int64_t first_observed = std::max<int64_t>(options_.history_start, 1);
  return std::max<int64_t>(options_.warmup_steps, first_observed + 1 + options_.window);
}

void Controller::select_by_gaps(int64_t step, std::vector<uint8_t>& selected) const {
  const int n_decision = units_.n_decision_units();
  selected.assign(static_cast<size_t>(n_decision), 0);
  if (step < options_.warmup_steps) return;
  if (gaps_.empty()) {
    throw std::logic_error("gnmr controller: oracle at step " + std::to_string(step) +
                           " without recovery gaps (set_recovery_gaps)");
  }
  std::vector<double> key(static_cast<size_t>(n_decision));
  for (int d = 0; d < n_decision; ++d) key[d] = decision_gap(d);
  std::vector<int> order(static_cast<size_t>(n_decision));
  std::iota(order.begin(), order.end(), 0);
  sort_by_priority(order, key);
  BudgetFiller filler(units_, budget_, per_kind_cap_, &pinned_);
  for (int d : order) {
    if (filler.full()) break;
    selected[d] = filler.offer(d);
  }
}

RoutingPlan Controller::oracle_plan(int64_t step) const {
  std::vector<uint8_t> selected;
  select_by_gaps(step, selected);
  RoutingPlan plan = all_paths(Path::Low);
  for (int d = 0; d < units_.n_decision_units(); ++d) {
    if (!selected[d]) continue;
    for (UnitId unit : units_.members(d)) plan.path[unit] = Path::Recovery;
  }
  return plan;
}

RoutingPlan Controller::observe(int64_t step, const std::vector<float>& unit_grad_norms) {
  if (unit_grad_norms.size() != static_cast<size_t>(units_.n_units())) {
    throw std::invalid_argument("gnmr controller: observe got " +
                                std::to_string(unit_grad_norms.size()) + " norms for " +
                                std::to_string(units_.n_units()) + " units");
  }
  return observe(step, unit_grad_norms.data());
}

RoutingPlan Controller::observe(int64_t step, const float* unit_grad_norms) {
  if (observations_ > 0 && step <= last_step_) {
    throw std::invalid_argument("gnmr controller: observe(step " + std::to_string(step) +
                                ") after step " + std::to_string(last_step_) +
                                "; steps must increase");
  }
  const int n_decision = units_.n_decision_units();
  const bool use_delta = kind_ != ControllerKind::GnmrNoDelta;
  Thresholds thresholds = thresholds_at(options_, step);
  if (!use_delta) thresholds.beta = std::numeric_limits<double>::infinity();
  const bool decisions = step >= options_.warmup_steps;
  // Before history_start no unit is observed (controller_options.h): the monitor's state is
  // left as if these steps never happened, and no unit is judged, not even for an invalid
  // norm.
  const bool in_history = step >= options_.history_start;

  // 1. Scores (every kind runs the monitor, so telemetry is comparable).
  scores_.resize(static_cast<size_t>(n_decision));
  decision_norms_.resize(static_cast<size_t>(n_decision));
  eligible_.assign(static_cast<size_t>(n_decision), 0);
  for (int d = 0; d < n_decision; ++d) {
    decision_norms_[d] = units_.decision_norm(d, unit_grad_norms);
    if (in_history) {
      scores_[d] = monitor_.observe(d, decision_norms_[d], history_, thresholds.alpha);
    } else {
      scores_[d] = RiskMonitor::unobserved(decision_norms_[d]);
    }
    eligible_[d] = decisions && in_history && (scores_[d].ready() || !scores_[d].norm_valid);
  }
  PolicyInputs inputs{&scores_, &eligible_, thresholds, use_delta, ranking_};
  assess_units(inputs, locks_, policy_);

  // 2. Selection under the budget.
  BudgetFiller filler(units_, budget_, per_kind_cap_, &pinned_);
  RoutingPlan plan = all_paths(Path::Low);
  switch (kind_) {
    case ControllerKind::StaticLow:
      break;
    case ControllerKind::StaticHigh:
      plan = all_paths(Path::Recovery);
      break;
    case ControllerKind::Random:
    case ControllerKind::TopkNorm:
      if (decisions) {
        if (kind_ == ControllerKind::Random) {
          random_order(options_.seed, step, n_decision, order_);
        } else {
          topk_norm_order(decision_norms_, order_);
        }
        for (int d : order_) {
          if (filler.full()) break;
          policy_.selected[d] = filler.offer(d);
        }
      }
      break;
    case ControllerKind::Gnmr:
    case ControllerKind::GnmrNoDelta:
    case ControllerKind::GnmrNoLock:
      select_candidates(filler, policy_);
      update_locks(policy_, kind_ == ControllerKind::GnmrNoLock ? 0 : options_.lock_steps, locks_);
      break;
    case ControllerKind::Oracle:
      select_by_gaps(step, policy_.selected);
      break;
  }
  for (int d = 0; d < n_decision; ++d) {
    if (!policy_.selected[d]) continue;
    for (UnitId unit : units_.members(d)) plan.path[unit] = Path::Recovery;
  }

  // 3. Telemetry.
  StepTelemetry& t = step_telemetry_;
  t.step = step;
  t.decisions = decisions;
  t.alpha_t = thresholds.alpha;
  t.beta_t = thresholds.beta;
  t.active_units = plan.active_count();
  t.candidate_units = t.eligible_units = t.gnmr_exceedances = t.delta_exceedances = 0;
  t.invalid_norms = t.exceeding_units = t.switches = 0;
  t.units.resize(static_cast<size_t>(n_decision));
  t.gaps_measured = !gaps_.empty();
  for (int d = 0; d < n_decision; ++d) {
    const UnitScores& s = scores_[d];
    t.candidate_units += policy_.candidate[d];
    if (eligible_[d]) {
      const bool over_gnmr = s.gnmr > thresholds.alpha;
      const bool over_delta = s.delta > thresholds.beta;
      ++t.eligible_units;
      t.gnmr_exceedances += over_gnmr;
      t.delta_exceedances += over_delta;
      t.invalid_norms += !s.norm_valid;
      t.exceeding_units += over_gnmr || over_delta || !s.norm_valid;
    }
    UnitTrace& trace = t.units[d];
    trace.norm = s.norm;
    trace.gnmr = s.gnmr;
    trace.delta = s.delta;
    trace.risk = policy_.risk[d];
    trace.lock = locks_[d];
    trace.path = plan.path[units_.members(d)[0]];
    // A group's gap is the one the oracle ranks it by (written as null if not finite).
    trace.gap = t.gaps_measured ? decision_gap(d) : std::numeric_limits<double>::quiet_NaN();
  }
  gaps_.clear();
  for (int u = 0; u < units_.n_units(); ++u) t.switches += plan.path[u] != current_plan_.path[u];

  run_telemetry_.record(t, plan);
  current_plan_ = plan;
  last_step_ = step;
  ++observations_;
  return plan;
}

nlohmann::json Controller::summary() const {
  nlohmann::json summary = run_telemetry_.summary();
  summary["controller"] = options_.controller;
  summary["units"] = units_.n_units();
  summary["budget"] = budget_;
  return summary;
}

void Controller::write_trace_line(std::ostream& out) const {
  gnmr::write_trace_line(out, step_telemetry_, units_.granularity());
}

}  // namespace gnmr
