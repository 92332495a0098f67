// The overlapped data-parallel gradient reduction (docs/DESIGN.md §7, dist.bucket_mb > 0):
// listens to the model's last backward of a step and starts each bucket's collective
// (parallel/gradient_buckets.h) the moment backward has finished every parameter in it, so the
// communication of the last layers runs while backward computes the first ones. finish()
// then waits for what is left. Two collectives:
//   kAllReduce      plain data parallelism: every rank ends with the whole sum, the bits of the
//                   blocking sum (parallel/mpi_pending_sums.h says why, and when they are not);
//   kReduceScatter  ZeRO-1 (dist.zero=1): each rank ends with the sum of its own shard of the
//                   flat gradient (train/zero_shards.h), the bits of the blocking
//                   reduce_scatter_sum for any world size (parallel/mpi_pending_reduce_scatters.h).
#pragma once

#include <vector>

#include "model/gradient_ready_listener.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "parallel/gradient_buckets.h"

namespace gnmr {

enum class GradientReduction { kAllReduce, kReduceScatter };

class OverlappedGradientSum final : public GradientReadyListener {
 public:
  // The plan of model's flat gradient in buckets of bucket_mb MiB (> 0). comm and model must
  // outlive this object. kReduceScatter: the model's flat buffers are padded to the shard
  // layout (the buckets cover the padding too, so every shard element is reduced).
  OverlappedGradientSum(Communicator& comm, const LlamaModel& model, double bucket_mb,
                        GradientReduction reduction = GradientReduction::kAllReduce);

  // Starts every bucket this range completes (in plan order, the same on every rank since
  // every rank runs the same backward), then gives MPI a chance to move the earlier ones.
  void on_params_ready(int first_param, int last_param) override;
  // After the backward: waits until every bucket is reduced, so flat_grads() holds the sum
  // over ranks (kReduceScatter: this rank's shard of it). Error(Runtime) if the backward did not
  // report every parameter (then some bucket never started and the ranks would disagree on what was
  // summed).
  void finish();

  const std::vector<GradientBucket>& buckets() const { return buckets_; }

 private:
  Communicator& comm_;
  GradientReduction reduction_;
  Tensor flat_grads_;
  std::vector<GradientBucket> buckets_;
  std::vector<int> bucket_of_;        // by parameter index
  std::vector<int> params_left_;      // by bucket: parameters not yet reported this step
  std::vector<bool> param_reported_;  // this step
  size_t buckets_started_ = 0;
};

}  // namespace gnmr
