// The periodic cross-rank consistency check (docs/DESIGN.md §7, dist.check_every): data
// parallelism keeps one model replicated on every rank, and only bit-identical reductions
// and identical controller decisions keep the replicas equal. Every check_every steps the
// ranks compare a hash of the next step's routing plan and of the weights, so a divergence
// stops the run where it happened instead of surfacing as a refused checkpoint much later.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "controller/routing_plan.h"
#include "model/llama.h"
#include "parallel/communicator.h"

namespace gnmr {

uint64_t routing_plan_hash(const RoutingPlan& plan);
// Of the flat fp32 weights as they are in backend memory (padding included: it stays zero).
uint64_t weights_hash(Backend& backend, const LlamaModel& model);

// A collective: every rank calls it at the same step. Throws Error(Runtime) on every rank
// when the plans differ ("step N: the ranks' routing plans differ ...") or, else, when the
// weights do ("... weights differ ...").
void check_replicas_agree(Communicator& comm, Backend& backend, const LlamaModel& model,
                          const RoutingPlan& plan, int64_t step);

}  // namespace gnmr
