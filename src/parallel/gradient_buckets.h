// The bucket plan of an overlapped gradient reduction (docs/DESIGN.md §7): the flat gradient
// split into contiguous slices of about dist.bucket_mb MiB, each all-reduced as soon as
// backward has produced every parameter in it, while backward goes on with earlier layers.
//
// Plain data from plain data: the plan sees the parameters only as their offsets into the
// flat gradient (model/param_table.h lays them out in Hugging Face order, embedding first,
// lm_head last), so src/parallel needs nothing from the model.
#pragma once

#include <cstdint>
#include <vector>

namespace gnmr {

struct GradientBucket {
  int first_param = 0, last_param = 0;  // inclusive range of parameter indices
  int64_t begin = 0, end = 0;           // elements [begin, end) of the flat gradient
  int64_t numel() const { return end - begin; }
};

// param_offsets: where each parameter starts in the flat gradient, strictly ascending, the
// first 0; parameter i owns [param_offsets[i], param_offsets[i + 1]) (its alignment padding
// included) and the last one runs to flat_size. bucket_mb: the bucket size in MiB of fp32
// elements, > 0 (0, "one reduction after backward", is the caller's own path).
//
// The buckets come last parameter first, the order backward finishes them (lm_head, final
// norm, the last layer, ..., the embedding), so launching them in plan order is launching
// them as they become ready. A bucket takes whole parameters while it stays within
// bucket_mb; a parameter that alone is larger gets a bucket of its own (splitting it would
// not start anything earlier: all its elements become final at once). Together the buckets
// cover [0, flat_size) exactly once. Throws std::invalid_argument on offsets that break these
// rules or a bucket_mb that is not finite and > 0.
std::vector<GradientBucket> plan_gradient_buckets(const std::vector<int64_t>& param_offsets,
                                                  int64_t flat_size, double bucket_mb);

// bucket_of[p] = the index in `buckets` of the bucket holding parameter p.
std::vector<int> bucket_of_each_param(const std::vector<GradientBucket>& buckets, int num_params);

}  // namespace gnmr
