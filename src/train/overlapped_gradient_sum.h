// The overlapped data-parallel gradient sum (docs/DESIGN.md §7, dist.bucket_mb > 0): listens
// to the model's last backward of a step and starts each bucket's all-reduce
// (parallel/gradient_buckets.h) the moment backward has finished every parameter in it, so the
// communication of the last layers runs while backward computes the first ones. finish()
// then waits for what is left. The bits are those of the blocking sum
// (parallel/mpi_pending_sums.h says why, and when they are not).
#pragma once

#include <vector>

#include "model/gradient_ready_listener.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "parallel/gradient_buckets.h"

namespace gnmr {

class OverlappedGradientSum final : public GradientReadyListener {
 public:
  // The plan of model's flat gradient in buckets of bucket_mb MiB (> 0). comm and model must
  // outlive this object.
  OverlappedGradientSum(Communicator& comm, const LlamaModel& model, double bucket_mb);

  // Starts every bucket this range completes (in plan order, the same on every rank since
  // every rank runs the same backward), then gives MPI a chance to move the earlier ones.
  void on_params_ready(int first_param, int last_param) override;
  // After the backward: waits until every bucket is summed, so flat_grads() holds the sum
  // over ranks. Error(Runtime) if the backward did not report every parameter (then some
  // bucket never started and the ranks would disagree on what was summed).
  void finish();

  const std::vector<GradientBucket>& buckets() const { return buckets_; }

 private:
  Communicator& comm_;
  Tensor flat_grads_;
  std::vector<GradientBucket> buckets_;
  std::vector<int> bucket_of_;        // by parameter index
  std::vector<int> params_left_;      // by bucket: parameters not yet reported this step
  std::vector<bool> param_reported_;  // this step
  size_t buckets_started_ = 0;
};

}  // namespace gnmr
