// Controller telemetry (docs/DESIGN.md §3): what one observation decided (StepTelemetry), the
// run-level accumulators behind the summary (RunTelemetry), and the compact per-unit trace.
//
// Score counts (candidates, exceedances, eligible) are over decision units — projection
// units unless granularity = "group". Path counts (active, switches, the recovery table) are
// over projection units.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "controller/routing_plan.h"
#include "controller/units.h"

namespace gnmr {

struct UnitTrace {
  double norm = 0.0;      // the decision unit's norm (group: L2 of its members)
  double gnmr = 0.0;      // NaN while undefined or for an invalid norm
  double delta = 0.0;     // NaN while undefined or for an invalid norm
  double risk = 0.0;      // ranking key (policy.h); 0 for baselines
  int32_t lock = 0;       // lock after this observation's update
  Path path = Path::Low;  // path in the plan returned by this observation
  double gap = 0.0;       // measured recovery gap (Controller::set_recovery_gaps); NaN if none
};

struct StepTelemetry {
  int64_t step = -1;       // the observed step; the plan is for step + 1
  bool decisions = false;  // past warm-up (step >= warmup_steps)
  double alpha_t = 0.0;
  double beta_t = 0.0;           // +inf for gnmr_no_delta
  int active_units = 0;          // projection units on Recovery in the returned plan
  int candidate_units = 0;       // decision units: risky or locked
  int eligible_units = 0;        // decision units judged this step (ready or invalid norm);
                                 // none before warmup_steps or gnmr.history_start
  int gnmr_exceedances = 0;      // eligible units with GNMR > α_t (finite or not)
  int delta_exceedances = 0;     // eligible units with Δ-GNMR > β_t
  int invalid_norms = 0;         // eligible units whose norm was NaN/Inf/negative
  int exceeding_units = 0;       // eligible units with any of the three
  int switches = 0;              // projection units whose path differs from the previous plan
  bool gaps_measured = false;    // UnitTrace::gap holds this step's recovery gaps
  std::vector<UnitTrace> units;  // [n_decision_units]

  // The per-step fields for the metrics line.
  nlohmann::json metrics_fields() const;
};

struct RunTelemetry {
  int64_t steps = 0;                 // observations
  int64_t eligible_unit_steps = 0;   // Σ eligible_units
  int64_t exceeding_unit_steps = 0;  // Σ exceeding_units
  int64_t gnmr_exceedances = 0;
  int64_t delta_exceedances = 0;
  int64_t invalid_norms = 0;
  int64_t active_unit_steps = 0;  // Σ active_units
  int64_t switches = 0;
  std::vector<int64_t> recovered_steps;  // [n_layers * 7]: plans with the unit on Recovery

  explicit RunTelemetry(int n_units = 0) : recovered_steps(static_cast<size_t>(n_units), 0) {}

  void record(const StepTelemetry& step, const RoutingPlan& plan);

  // exceeding_unit_steps / eligible_unit_steps (the paper reports < 0.2%); 0 if none.
  double exceedance_rate() const;
  // mean over observations of active_units / n_units.
  double active_fraction() const;
  double switches_per_1000_steps() const;

  // {"steps", "eligible_unit_steps", "exceeding_unit_steps", "exceedance_rate",
  //  "gnmr_exceedances", "delta_exceedances", "invalid_norms", "active_fraction",
  //  "mean_active_units", "switches", "switches_per_1000_steps",
  //  "kinds": ["q",..,"down"], "recovered_steps": [[per kind] per layer]}
  nlohmann::json summary() const;
};

// One compact JSON line (no trailing newline) for plots:
// {"kind":"gnmr_trace","step":S,"granularity":"projection","norm":[..],"gnmr":[..],
//  "delta":[..],"risk":[..],"lock":[..],"path":[0|1,..]} plus "gap":[..] on steps whose
// recovery gaps were measured, one entry per decision unit (for "group": the attention then
// MLP group of each layer), 6 significant digits, null for NaN/Inf.
void write_trace_line(std::ostream& out, const StepTelemetry& step, Granularity granularity);

}  // namespace gnmr
