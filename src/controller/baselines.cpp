#include "controller/baselines.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "controller/policy.h"
#include "util/splitmix64.h"

namespace gnmr {

void random_order(uint64_t seed, int64_t step, int n, std::vector<int>& order) {
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const uint64_t key = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(step)));
  for (int i = n - 1; i > 0; --i) {
    // The i-th draw of the stream; modulo bias is below 2^-50 for any realistic unit count.
    const uint64_t draw = splitmix64(key + static_cast<uint64_t>(i) * kSplitmix64Golden);
    const int j = static_cast<int>(draw % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
}

void topk_norm_order(const std::vector<double>& norms, std::vector<int>& order) {
  std::vector<double> key(norms.size());
  for (size_t u = 0; u < norms.size(); ++u) {
    const bool valid = std::isfinite(norms[u]) && norms[u] >= 0.0;
    key[u] = valid ? norms[u] : std::numeric_limits<double>::infinity();
  }
  order.resize(norms.size());
  std::iota(order.begin(), order.end(), 0);
  sort_by_priority(order, key);
}

}  // namespace gnmr
