// The Communicator calls that not every implementation has (communicator.h).
#include "parallel/communicator.h"

#include "util/error.h"

namespace gnmr {

void Communicator::reduce_scatter_sum(Tensor&) {
  throw Error(ErrorKind::NotBuilt, "communicator \"" + name() +
                                       "\" has no reduce_scatter_sum: dist.zero=1 runs on the "
                                       "local, mpi or nccl communicator");
}

void Communicator::all_gather(Tensor&) {
  throw Error(ErrorKind::NotBuilt, "communicator \"" + name() +
                                       "\" has no all_gather: dist.zero=1 runs on the local, "
                                       "mpi or nccl communicator");
}

void Communicator::start_reduce_scatter_sum(Tensor, int64_t, int64_t) {
  if (world_size() == 1) return;
  throw Error(ErrorKind::NotBuilt, "communicator \"" + name() +
                                       "\" has no start_reduce_scatter_sum: dist.zero=1 runs on "
                                       "the local, mpi or nccl communicator");
}

}  // namespace gnmr
