#include "controller/telemetry.h"

#include <cmath>
#include <cstdio>

namespace gnmr {

nlohmann::json StepTelemetry::metrics_fields() const {
  return nlohmann::json{
      {"active_units", active_units},         {"candidate_units", candidate_units},
      {"gnmr_exceedances", gnmr_exceedances}, {"delta_exceedances", delta_exceedances},
      {"invalid_norms", invalid_norms},       {"switches", switches}};
}

void RunTelemetry::record(const StepTelemetry& step, const RoutingPlan& plan) {
  ++steps;
  eligible_unit_steps += step.eligible_units;
  exceeding_unit_steps += step.exceeding_units;
  gnmr_exceedances += step.gnmr_exceedances;
  delta_exceedances += step.delta_exceedances;
  invalid_norms += step.invalid_norms;
  active_unit_steps += step.active_units;
  switches += step.switches;
  for (size_t u = 0; u < plan.path.size() && u < recovered_steps.size(); ++u) {
    recovered_steps[u] += plan.path[u] == Path::Recovery ? 1 : 0;
  }
}

double RunTelemetry::exceedance_rate() const {
  return eligible_unit_steps > 0
             ? static_cast<double>(exceeding_unit_steps) / static_cast<double>(eligible_unit_steps)
             : 0.0;
}

double RunTelemetry::active_fraction() const {
  const double unit_steps =
      static_cast<double>(steps) * static_cast<double>(recovered_steps.size());
  return unit_steps > 0 ? static_cast<double>(active_unit_steps) / unit_steps : 0.0;
}

double RunTelemetry::switches_per_1000_steps() const {
  return steps > 0 ? 1000.0 * static_cast<double>(switches) / static_cast<double>(steps) : 0.0;
}

nlohmann::json RunTelemetry::summary() const {
  nlohmann::json kinds = nlohmann::json::array();
  for (int k = 0; k < kKindsPerLayer; ++k) {
    kinds.push_back(projection_kind_name(static_cast<ProjectionKind>(k)));
  }
  nlohmann::json table = nlohmann::json::array();
  for (size_t layer = 0; layer * kKindsPerLayer < recovered_steps.size(); ++layer) {
    nlohmann::json row = nlohmann::json::array();
    for (int k = 0; k < kKindsPerLayer; ++k)
      row.push_back(recovered_steps[layer * kKindsPerLayer + k]);
    table.push_back(row);
  }
  return nlohmann::json{
      {"steps", steps},
      {"eligible_unit_steps", eligible_unit_steps},
      {"exceeding_unit_steps", exceeding_unit_steps},
      {"exceedance_rate", exceedance_rate()},
      {"gnmr_exceedances", gnmr_exceedances},
      {"delta_exceedances", delta_exceedances},
      {"invalid_norms", invalid_norms},
      {"active_fraction", active_fraction()},
      {"mean_active_units",
       steps > 0 ? static_cast<double>(active_unit_steps) / static_cast<double>(steps) : 0.0},
      {"switches", switches},
      {"switches_per_1000_steps", switches_per_1000_steps()},
      {"kinds", kinds},
      {"recovered_steps", table}};
}

namespace {

void write_number(std::ostream& out, double value) {
  if (!std::isfinite(value)) {
    out << "null";
    return;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  out << buffer;
}

template <typename Field>
void write_array(std::ostream& out, const char* name, const std::vector<UnitTrace>& units,
                 Field field) {
  out << ",\"" << name << "\":[";
  for (size_t u = 0; u < units.size(); ++u) {
    if (u > 0) out << ',';
    field(units[u]);
  }
  out << ']';
}

}  // namespace

void write_trace_line(std::ostream& out, const StepTelemetry& step, Granularity granularity) {
  const auto& units = step.units;
  out << "{\"kind\":\"gnmr_trace\",\"step\":" << step.step << ",\"granularity\":\""
      << (granularity == Granularity::Group ? "group" : "projection") << '"';
  write_array(out, "norm", units, [&out](const UnitTrace& u) { write_number(out, u.norm); });
  write_array(out, "gnmr", units, [&out](const UnitTrace& u) { write_number(out, u.gnmr); });
  write_array(out, "delta", units, [&out](const UnitTrace& u) { write_number(out, u.delta); });
  write_array(out, "risk", units, [&out](const UnitTrace& u) { write_number(out, u.risk); });
  if (step.gaps_measured) {
    write_array(out, "gap", units, [&out](const UnitTrace& u) { write_number(out, u.gap); });
  }
  write_array(out, "lock", units, [&out](const UnitTrace& u) { out << u.lock; });
  write_array(out, "path", units, [&out](const UnitTrace& u) { out << static_cast<int>(u.path); });
  out << '}';
}

}  // namespace gnmr
