#include "train/replica_check.h"

#include <string>
#include <vector>

#include "util/error.h"
#include "util/fnv1a.h"

namespace gnmr {

uint64_t routing_plan_hash(const RoutingPlan& plan) {
  return fnv1a(plan.path.data(), plan.path.size() * sizeof(Path));
}

uint64_t weights_hash(Backend& backend, const LlamaModel& model) {
  std::vector<float> host(size_t(model.flat_weights().numel()));
  backend.copy_to_host(model.flat_weights(), host.data());
  return fnv1a(host.data(), host.size() * sizeof(float));
}

void check_replicas_agree(Communicator& comm, Backend& backend, const LlamaModel& model,
                          const RoutingPlan& plan, int64_t step) {
  // Both collectives run on every rank whatever the first answers, so no rank is left
  // waiting in the second.
  const bool plans_agree = comm.all_agree(routing_plan_hash(plan));
  const bool weights_agree = comm.all_agree(weights_hash(backend, model));
  const std::string at = "step " + std::to_string(step) + " (dist.check_every): the ranks' ";
  if (!plans_agree) {
    throw Error(ErrorKind::Runtime,
                at + "routing plans for the next step differ; the controllers saw different "
                     "gradient norms, so the gradient reduction is not bit-identical across ranks");
  }
  if (!weights_agree) {
    throw Error(ErrorKind::Runtime,
                at + "weights differ; the replicas diverged (a gradient reduction or update that "
                     "is not bit-identical across ranks)");
  }
}

}  // namespace gnmr
