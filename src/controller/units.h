// Units: the 7 projection operators of every LLaMA-2 layer, and how they are grouped into
// decision units (docs/DESIGN.md §3: each projection is a "recoverable unit").
//
// unit id = layer * 7 + kind, kinds in forward order q, k, v, o, gate, up, down.
// With granularity "group", a layer's attention projections (q,k,v,o) form one decision
// unit and its MLP projections (gate,up,down) another: decision id = layer * 2 + {0: attn, 1: mlp}.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gnmr {

using UnitId = int32_t;

enum class ProjectionKind : uint8_t { Q = 0, K = 1, V = 2, O = 3, Gate = 4, Up = 5, Down = 6 };
constexpr int kKindsPerLayer = 7;

// "q", "k", "v", "o", "gate", "up", "down" — the names used by config keys and telemetry.
const char* projection_kind_name(ProjectionKind kind);
std::optional<ProjectionKind> projection_kind_from_name(std::string_view name);
// "q, k, v, o, gate, up, down" for error messages.
std::string projection_kind_list();

inline UnitId unit_id(int layer, ProjectionKind kind) {
  return layer * kKindsPerLayer + static_cast<int>(kind);
}
inline int unit_layer(UnitId unit) {
  return unit / kKindsPerLayer;
}
inline ProjectionKind unit_kind(UnitId unit) {
  return static_cast<ProjectionKind>(unit % kKindsPerLayer);
}

enum class Granularity : uint8_t { Projection = 0, Group = 1 };

// The mapping between projection units (what the trainer measures and routes) and decision
// units (what the controller scores, ranks and locks). With Projection granularity the two
// are identical.
class DecisionUnits {
 public:
  DecisionUnits(int n_layers, Granularity granularity);

  int n_layers() const { return n_layers_; }
  int n_units() const { return n_layers_ * kKindsPerLayer; }
  int n_decision_units() const { return static_cast<int>(members_.size()); }
  Granularity granularity() const { return granularity_; }

  // Projection units of decision unit d, ascending.
  const std::vector<UnitId>& members(int decision) const { return members_[decision]; }
  int decision_of(UnitId unit) const { return decision_of_[unit]; }

  // Norm of decision unit d from per-projection norms [n_units]: the projection's own norm,
  // or for a group the L2 of its members' norms, sqrt(sum n_i^2) (non-finite if any member is).
  double decision_norm(int decision, const float* unit_grad_norms) const;

 private:
  int n_layers_;
  Granularity granularity_;
  std::vector<std::vector<UnitId>> members_;
  std::vector<int> decision_of_;
};

}  // namespace gnmr
