// ControllerOptions: the config section `gnmr`, as plain data, with its parser and defaults.
//
// Every choice the paper leaves open (docs/DESIGN.md §3) is an option with a documented default:
//   controller          "gnmr" | "static_low" | "static_high" | "random" | "topk_norm" |
//                       "gnmr_no_delta" | "gnmr_no_lock" | "oracle"          (default "gnmr")
//   max_active          budget: a count if >= 1 (must be an integer), a fraction of the
//                       projection units if in (0, 1) (rounded down, so the active fraction
//                       never exceeds it), 0 = nothing is ever recovered      (default 0.1)
//   alpha, beta         GNMR and Δ-GNMR thresholds α, β                       (default 1.5, 1.5)
//   window              δ, the Δ-GNMR window in steps                          (default 8)
//   lock_steps          T_lock, calm steps a selected unit stays a candidate   (default 10)
//   warmup_steps        no decisions before this step                          (default 20)
//   history_start       norms of steps < history_start never enter the RiskMonitor, so GNMR's
//                       history and the Δ window begin here; 0 = the paper's whole history
//                                                                              (default 0)
//   threshold_schedule  "constant" | "linear" | "cosine": α_t, β_t move from alpha/beta to
//                       alpha_final/beta_final over steps [0, schedule_steps]  (default "constant")
//   alpha_final, beta_final   end thresholds; null = same as alpha / beta      (default null)
//   schedule_steps      length of the schedule; >= 1 unless constant           (default 0)
//   ranking             risk key: "max_ratio" = max(GNMR/α_t, Δ/β_t), "sum_ratio" =
//                       GNMR/α_t + Δ/β_t, "gnmr" = GNMR, "delta" = Δ-GNMR     (default "max_ratio")
//   history             "raw": every finite norm enters the running mean as is; "capped": a
//                       spike (GNMR > α_t) enters as α_t·mean and its GNMR enters the Δ window
//                       as α_t, as ZClip/AdaGC feed back the clipped value   (default "raw")
//   granularity         "projection": each projection is a decision unit; "group": a layer's
//                       attention (q,k,v,o) or MLP (gate,up,down) projections are one decision
//                       unit sharing one path, its norm the L2 of the members' norms; the
//                       budget stays in projection units and a group is chosen only if all
//                       its members fit                                        (default
//                       "projection")
//   per_kind_cap        {kind: max active units of that kind}, e.g. {"down": 2} (default {})
//   seed                seed of the `random` baseline                          (default 0)
//   oracle_same_step    oracle only: recover on the step whose gaps were measured instead of
//                       the next one (GNMR's one-step lag)                     (default false)
//
// Why history_start: on short runs (a few hundred steps) the early transient dominates the
// whole-history mean — per-unit gradient norms first collapse ~10x during the lr warm-up, then
// rebound 10-20x — so GNMR stays above α for 35-40% of unit-steps. In the paper's 10k+-step
// runs that transient is a negligible part of the history; starting the history after it
// mimics that regime. Tiny model, fp4 stress, 300 steps: exceedance 39% with the history from
// step 1, 14% from step 40 (α = 1.5), 3.8% from step 40 at α = 2. Before history_start a unit
// is not observed at all (controller.h).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "controller/units.h"

namespace gnmr {

struct ControllerOptions {
  std::string controller = "gnmr";
  double max_active = 0.1;
  double alpha = 1.5;
  double beta = 1.5;
  int window = 8;
  int lock_steps = 10;
  int warmup_steps = 20;
  int64_t history_start = 0;  // first step whose norms enter the RiskMonitor
  std::string threshold_schedule = "constant";
  double alpha_final = std::numeric_limits<double>::quiet_NaN();  // NaN = same as alpha
  double beta_final = std::numeric_limits<double>::quiet_NaN();   // NaN = same as beta
  int64_t schedule_steps = 0;
  std::string ranking = "max_ratio";
  std::string history = "raw";
  std::string granularity = "projection";
  std::map<std::string, int> per_kind_cap;
  uint64_t seed = 0;
  bool oracle_same_step = false;
};

// Parses the `gnmr` config section; missing keys keep their defaults. Throws
// std::invalid_argument naming the key (`gnmr.KEY: ...`) for an unknown key, a wrong type or
// an invalid value.
ControllerOptions controller_options_from_json(const nlohmann::json& gnmr_section);

// The section with every key at its default (alpha_final/beta_final are null).
nlohmann::json controller_options_defaults();

// The resolved section (alpha_final/beta_final resolved to numbers);
// controller_options_from_json(controller_options_to_json(o)) reproduces o.
nlohmann::json controller_options_to_json(const ControllerOptions& options);

// Checks values and cross-key rules; throws std::invalid_argument naming the key.
void validate_controller_options(const ControllerOptions& options);

// Checks the budget against the model: a count (max_active >= 1) above n_units, the
// projection units of the model (kKindsPerLayer per layer), would be silently cut to n_units,
// so it is refused; throws std::invalid_argument naming gnmr.max_active and n_units.
void validate_budget(double max_active, int n_units);

// ---- resolved forms, used by the controller --------------------------------------------

enum class ControllerKind : uint8_t {
  Gnmr,
  StaticLow,
  StaticHigh,
  Random,
  TopkNorm,
  GnmrNoDelta,
  GnmrNoLock,
  Oracle
};
enum class ThresholdSchedule : uint8_t { Constant, Linear, Cosine };
enum class RankingKey : uint8_t { MaxRatio, SumRatio, Gnmr, Delta };
enum class HistoryMode : uint8_t { Raw, Capped };

ControllerKind parse_controller_kind(const std::string& name);
ThresholdSchedule parse_threshold_schedule(const std::string& name);
RankingKey parse_ranking_key(const std::string& name);
HistoryMode parse_history_mode(const std::string& name);
Granularity parse_granularity(const std::string& name);

// The budget in projection units: floor(f * n_units) for a fraction f in (0,1), else
// min(count, n_units).
int resolve_budget(double max_active, int n_units);

// Per-kind caps indexed by ProjectionKind; kinds without a cap get INT_MAX.
std::array<int, kKindsPerLayer> resolve_per_kind_caps(const std::map<std::string, int>& caps);

}  // namespace gnmr
