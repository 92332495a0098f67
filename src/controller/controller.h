// Controller: the one interface the trainer talks to (docs/DESIGN.md §2 step 5, §3).
//
// Each step the trainer passes the L2 norm of every projection unit's weight gradient
// (after accumulation and all-reduce, before clipping) and gets the routing plan for the
// next step. The controller kind (GNMR, its ablations, or a baseline) is a strategy inside;
// monitor, budget, telemetry and state are shared, so every kind runs under the same budget
// and reports the same telemetry.
//
//   gnmr            GNMR + Δ-GNMR candidates, budgeted, with locks (policy.h)
//   gnmr_no_delta   β = ∞: Δ-GNMR neither makes candidates nor enters the risk
//   gnmr_no_lock    T_lock = 0: only currently risky units are recovered
//   static_low      always all Low
//   static_high     always all Recovery, regardless of the budget and caps
//   random          `budget` random units per step, from (seed, step) (baselines.h)
//   topk_norm       the `budget` largest raw norms
//   oracle          the `budget` largest measured recovery gaps (research only: the session
//                   pays two extra forward+backward passes per step to measure them)
// Dynamic controllers return all-Low plans until step >= warmup_steps; GNMR kinds also wait
// for each unit's GNMR and Δ-GNMR to be defined (its (δ+2)-th valid norm); an invalid norm
// (NaN/Inf) after warm-up makes its unit a candidate of risk +inf (monitor.h).
// Before step history_start no unit is observed: its norm reaches neither the monitor's mean
// nor its Δ window, its scores are undefined, and it is never eligible, even for an invalid
// norm — so the telemetry (eligible, exceedances, invalid_norms) counts nothing for it, as
// before warm-up. Plans of random and topk_norm, which ignore the monitor, do not change.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <stdexcept>
#include <vector>

#include "controller/controller_options.h"
#include "controller/monitor.h"
#include "controller/policy.h"
#include "controller/routing_plan.h"
#include "controller/telemetry.h"
#include "controller/units.h"

namespace gnmr {

// Controller::load_state's three refusals, so that a caller can say which it is: the blob is
// not a valid state at all (truncated, a flipped bit, bad magic) ...
class ControllerStateDamaged : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ... or an intact state of a format version this build does not read (a newer gnmr's) ...
class ControllerStateVersion : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ... or a valid state of another controller (other gnmr.* options or unit count).
class ControllerStateMismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Controller {
 public:
  // n_layers >= 1; n_units = 7 * n_layers. Throws std::invalid_argument for invalid options.
  // PINNED_LAYERS (precision.recovery_layers; -1 is the last layer) run on recovery whatever
  // the controller decides, outside its budget: their units are judged (telemetry counts
  // their exceedances) but never offered to the budget, so it buys max_active units on top
  // of them. The controller's plans, its telemetry and trace leave them Low (its choice); the
  // session puts them on recovery (with_fixed_recovery), and units_recovery counts them.
  Controller(const ControllerOptions& options, int n_layers,
             const std::vector<int>& pinned_layers = {});

  // The plan for the first step, before any observation: all Recovery for static_high,
  // all Low otherwise.
  RoutingPlan initial_plan() const;

  // Observes step `step`'s norms ([n_units], indexed by UnitId) and returns the plan for
  // step + 1. Steps must increase strictly (std::invalid_argument otherwise).
  RoutingPlan observe(int64_t step, const float* unit_grad_norms);
  RoutingPlan observe(int64_t step, const std::vector<float>& unit_grad_norms);

  // Each projection unit's recovery gap on the step about to be observed ([n_units], indexed
  // by UnitId; the session measures it, README "The oracle selector" defines it). The oracle
  // needs them before every observe past warm-up; any controller records them in that
  // observation's trace. One observe consumes them.
  void set_recovery_gaps(const std::vector<float>& gaps);
  bool needs_recovery_gaps() const { return kind_ == ControllerKind::Oracle; }
  // The oracle's choice from the gaps last set: decision units by decreasing gap (a group's is
  // its largest member's; a non-finite gap ranks first, ties by lower id) offered to the
  // budget, all Low before warmup_steps. observe() makes it with GNMR's one-step lag (the
  // plan for step + 1); with gnmr.oracle_same_step the session applies it to `step` itself.
  RoutingPlan oracle_plan(int64_t step) const;

  // The plan last returned by observe (initial_plan() before the first observation, and the
  // restored plan after load_state).
  const RoutingPlan& current_plan() const { return current_plan_; }
  const StepTelemetry& last_telemetry() const { return step_telemetry_; }
  const RunTelemetry& run_telemetry() const { return run_telemetry_; }
  // run_telemetry().summary() plus "controller", "units", "budget".
  nlohmann::json summary() const;
  // The compact per-unit trace of the last observation (telemetry.h).
  void write_trace_line(std::ostream& out) const;

  // A versioned, self-checking binary blob of everything the controller knows (monitor
  // sums/counts/windows, locks, current plan, last step, run telemetry accumulators): a
  // controller restored from it continues bit-exactly. load_state throws
  // ControllerStateMismatch naming the difference for a blob from another unit count or
  // other options, ControllerStateVersion for an intact blob of another format version,
  // ControllerStateDamaged for a damaged blob. (controller_state.cpp)
  std::vector<uint8_t> save_state() const;
  void load_state(const std::vector<uint8_t>& blob);

  const ControllerOptions& options() const { return options_; }
  ControllerKind kind() const { return kind_; }
  int n_layers() const { return units_.n_layers(); }
  int n_units() const { return units_.n_units(); }
  int budget() const { return budget_; }  // in projection units
  // The first step whose observe() can select a unit by its norms (a non-finite norm aside):
  // gnmr.warmup_steps, and for the GNMR kinds also the first step with both scores defined (the
  // first observed step, max(history_start, 1), then one norm of history and `window` GNMR
  // values). Steps count from 1; the plan made at step t runs at step t + 1. Static kinds: never
  // (INT64_MAX).
  int64_t first_selecting_step() const;
  const DecisionUnits& decision_units() const { return units_; }
  // Lock of each decision unit after the last observation.
  const std::vector<int32_t>& locks() const { return locks_; }
  // Whether decision unit d lies in a pinned layer ([n_decision_units]).
  const std::vector<uint8_t>& pinned() const { return pinned_; }

 private:
  RoutingPlan all_paths(Path path) const;
  bool uses_gnmr_policy() const;
  // A decision unit's gap: its largest member's, +inf if any member's is not finite.
  double decision_gap(int decision) const;
  // Offers decision units by decreasing gap (oracle_plan) and marks the ones taken.
  void select_by_gaps(int64_t step, std::vector<uint8_t>& selected) const;

  ControllerOptions options_;
  ControllerKind kind_;
  RankingKey ranking_;
  HistoryMode history_;
  DecisionUnits units_;
  int budget_;
  std::array<int, kKindsPerLayer> per_kind_cap_;
  std::vector<uint8_t> pinned_;  // [n_decision_units]

  // State (saved and restored).
  RiskMonitor monitor_;
  std::vector<int32_t> locks_;  // [n_decision_units]
  RoutingPlan current_plan_;
  int64_t observations_ = 0;
  int64_t last_step_ = 0;
  RunTelemetry run_telemetry_;

  // Per-step results and scratch, rebuilt by every observe.
  StepTelemetry step_telemetry_;
  std::vector<UnitScores> scores_;
  std::vector<double> decision_norms_;
  std::vector<uint8_t> eligible_;
  std::vector<int> order_;
  PolicyResult policy_;
  std::vector<double> gaps_;  // [n_units] from set_recovery_gaps; empty once consumed
};

}  // namespace gnmr
