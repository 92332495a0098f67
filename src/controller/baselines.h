// Baseline controllers for ablations (docs/DESIGN.md §3), under the same budget and caps as GNMR:
// static_low and static_high need no code beyond the plan; `random` and `topk_norm` only
// decide the order in which decision units are offered to the BudgetFiller.
#pragma once

#include <cstdint>
#include <vector>

namespace gnmr {

// A uniformly random order of decision units 0..n-1, a pure function of (seed, step):
// a counter-based generator (SplitMix64 over a key hashed from seed and step) drives a
// Fisher-Yates shuffle, so the baseline is reproducible and carries no state.
void random_order(uint64_t seed, int64_t step, int n, std::vector<int>& order);

// Decision units by decreasing raw norm, ties by id; an invalid (NaN/Inf) norm ranks first.
void topk_norm_order(const std::vector<double>& norms, std::vector<int>& order);

}  // namespace gnmr
