#include "train/overlapped_gradient_sum.h"

#include <stdexcept>
#include <string>

#include "model/param_table.h"
#include "util/error.h"

namespace gnmr {

namespace {

std::vector<GradientBucket> plan_for(const LlamaModel& model, double bucket_mb) {
  try {
    return plan_gradient_buckets(param_offsets(model.params()), model.flat_grads().numel(),
                                 bucket_mb);
  } catch (const std::invalid_argument& e) {
    throw Error(ErrorKind::Config, std::string("config: \"dist.bucket_mb\": ") + e.what());
  }
}

}  // namespace

OverlappedGradientSum::OverlappedGradientSum(Communicator& comm, const LlamaModel& model,
                                             double bucket_mb, GradientReduction reduction)
    : comm_(comm),
      reduction_(reduction),
      flat_grads_(model.flat_grads()),
      buckets_(plan_for(model, bucket_mb)) {
  const int num_params = int(model.params().size());
  bucket_of_ = bucket_of_each_param(buckets_, num_params);
  params_left_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    params_left_[b] = buckets_[b].last_param - buckets_[b].first_param + 1;
  }
  param_reported_.assign(size_t(num_params), false);
}

void OverlappedGradientSum::on_params_ready(int first_param, int last_param) {
  GNMR_CHECK(
      first_param >= 0 && first_param <= last_param && last_param < int(param_reported_.size()),
      "gradient-ready range [" + std::to_string(first_param) + ", " + std::to_string(last_param) +
          "] is not a range of the model's parameters");
  for (int p = first_param; p <= last_param; ++p) {
    GNMR_CHECK(!param_reported_[size_t(p)],
               "parameter " + std::to_string(p) + " reported ready twice in one backward");
    param_reported_[size_t(p)] = true;
    params_left_[size_t(bucket_of_[size_t(p)])] -= 1;
  }
  // In plan order: a bucket completed out of order waits for the ones before it, so every
  // rank starts the same sums in the same order whatever order the model reports in.
  while (buckets_started_ < buckets_.size() && params_left_[buckets_started_] == 0) {
    const GradientBucket& b = buckets_[buckets_started_];
    if (reduction_ == GradientReduction::kAllReduce) {
      comm_.start_allreduce_sum(tensor_view(flat_grads_, {b.numel()}, b.begin));
    } else {
      comm_.start_reduce_scatter_sum(flat_grads_, b.begin, b.end);
    }
    buckets_started_ += 1;
  }
  comm_.progress();
}

void OverlappedGradientSum::finish() {
  GNMR_CHECK(buckets_started_ == buckets_.size(),
             "the backward reported " + std::to_string(buckets_started_) + " of " +
                 std::to_string(buckets_.size()) +
                 " gradient buckets complete; every parameter must be reported once");
  comm_.wait_all();
  buckets_started_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    params_left_[b] = buckets_[b].last_param - buckets_[b].first_param + 1;
  }
  param_reported_.assign(param_reported_.size(), false);
}

}  // namespace gnmr
