#include "controller/units.h"

#include <cmath>
#include <limits>

namespace gnmr {

namespace {
constexpr std::array<const char*, kKindsPerLayer> kKindNames = {"q",    "k",  "v",   "o",
                                                                "gate", "up", "down"};
}  // namespace

const char* projection_kind_name(ProjectionKind kind) {
  return kKindNames[static_cast<int>(kind)];
}

std::optional<ProjectionKind> projection_kind_from_name(std::string_view name) {
  for (int k = 0; k < kKindsPerLayer; ++k) {
    if (name == kKindNames[k]) return static_cast<ProjectionKind>(k);
  }
  return std::nullopt;
}

std::string projection_kind_list() {
  std::string list;
  for (int k = 0; k < kKindsPerLayer; ++k) {
    if (k > 0) list += ", ";
    list += kKindNames[k];
  }
  return list;
}

DecisionUnits::DecisionUnits(int n_layers, Granularity granularity)
    : n_layers_(n_layers), granularity_(granularity) {
  decision_of_.resize(static_cast<size_t>(n_units()));
  for (int layer = 0; layer < n_layers; ++layer) {
    if (granularity == Granularity::Projection) {
      for (int k = 0; k < kKindsPerLayer; ++k) {
        UnitId unit = unit_id(layer, static_cast<ProjectionKind>(k));
        decision_of_[unit] = static_cast<int>(members_.size());
        members_.push_back({unit});
      }
    } else {
      std::vector<UnitId> attention, mlp;
      for (int k = 0; k < kKindsPerLayer; ++k) {
        auto kind = static_cast<ProjectionKind>(k);
        (kind < ProjectionKind::Gate ? attention : mlp).push_back(unit_id(layer, kind));
      }
      for (UnitId unit : attention) decision_of_[unit] = static_cast<int>(members_.size());
      members_.push_back(std::move(attention));
      for (UnitId unit : mlp) decision_of_[unit] = static_cast<int>(members_.size());
      members_.push_back(std::move(mlp));
    }
  }
}

double DecisionUnits::decision_norm(int decision, const float* unit_grad_norms) const {
  const std::vector<UnitId>& units = members_[decision];
  if (units.size() == 1) return static_cast<double>(unit_grad_norms[units[0]]);
  double sum_squares = 0.0;
  for (UnitId unit : units) {
    double n = static_cast<double>(unit_grad_norms[unit]);
    if (!std::isfinite(n) || n < 0.0) return std::numeric_limits<double>::quiet_NaN();
    sum_squares += n * n;
  }
  return std::sqrt(sum_squares);
}

}  // namespace gnmr
