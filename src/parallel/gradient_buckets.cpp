#include "parallel/gradient_buckets.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gnmr {

std::vector<GradientBucket> plan_gradient_buckets(const std::vector<int64_t>& param_offsets,
                                                  int64_t flat_size, double bucket_mb) {
  if (!std::isfinite(bucket_mb) || bucket_mb <= 0) {
    throw std::invalid_argument("bucket size must be finite and > 0 MiB, got " +
                                std::to_string(bucket_mb));
  }
  const int num_params = int(param_offsets.size());
  if (num_params == 0) return {};
  if (param_offsets[0] != 0) throw std::invalid_argument("the first parameter must start at 0");
  for (int p = 0; p < num_params; ++p) {
    const int64_t next = p + 1 < num_params ? param_offsets[size_t(p) + 1] : flat_size;
    if (next <= param_offsets[size_t(p)]) {
      throw std::invalid_argument("parameter offsets must ascend strictly up to the flat size " +
                                  std::to_string(flat_size) + " (parameter " + std::to_string(p) +
                                  ")");
    }
  }
  // At least one element, so a tiny bucket_mb still makes progress.
  const double cap_elements = std::max(1.0, bucket_mb * double(1 << 20) / sizeof(float));

  std::vector<GradientBucket> buckets;
  auto end_of = [&](int p) {
    return p + 1 < num_params ? param_offsets[size_t(p) + 1] : flat_size;
  };
  GradientBucket open{num_params - 1, num_params - 1, param_offsets.back(), flat_size};
  for (int p = num_params - 2; p >= 0; --p) {
    const int64_t begin = param_offsets[size_t(p)];
    if (double(open.end - begin) <= cap_elements) {
      open.first_param = p;
      open.begin = begin;
      continue;
    }
    buckets.push_back(open);
    open = GradientBucket{p, p, begin, end_of(p)};
  }
  buckets.push_back(open);
  return buckets;
}

std::vector<int> bucket_of_each_param(const std::vector<GradientBucket>& buckets, int num_params) {
  std::vector<int> bucket_of(size_t(num_params), -1);
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (int p = buckets[b].first_param; p <= buckets[b].last_param; ++p) {
      if (p < 0 || p >= num_params || bucket_of[size_t(p)] != -1) {
        throw std::invalid_argument("bucket plan does not hold each of the " +
                                    std::to_string(num_params) + " parameters exactly once");
      }
      bucket_of[size_t(p)] = int(b);
    }
  }
  for (int b : bucket_of) {
    if (b == -1) throw std::invalid_argument("bucket plan leaves a parameter out");
  }
  return bucket_of;
}

}  // namespace gnmr
