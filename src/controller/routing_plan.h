// The controller's output: which execution path each projection unit takes next step.
#pragma once

#include <cstdint>
#include <vector>

namespace gnmr {

// Low = the cheap low-precision path; Recovery = the high-fidelity path (docs/DESIGN.md §4).
enum class Path : uint8_t { Low = 0, Recovery = 1 };

struct RoutingPlan {
  std::vector<Path> path;  // [n_units], indexed by UnitId

  int active_count() const {
    int count = 0;
    for (Path p : path) count += p == Path::Recovery ? 1 : 0;
    return count;
  }
  bool operator==(const RoutingPlan& other) const { return path == other.path; }
  bool operator!=(const RoutingPlan& other) const { return path != other.path; }
};

}  // namespace gnmr
