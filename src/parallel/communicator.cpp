// The Communicator calls that not every implementation has, and ending a job after one rank
// failed (communicator.h).
#include "parallel/communicator.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <iostream>
#include <string>

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

void end_job_after_error(Communicator& comm, const std::exception& error) {
  const Error* gnmr_error = dynamic_cast<const Error*>(&error);
  std::string message = error.what();
  // The nccl communicator's errors name the rank already ("rank 1: ...", "rank 1 of 2: ...").
  const std::string rank = "rank " + std::to_string(comm.rank());
  if (message.rfind(rank + ": ", 0) != 0 && message.rfind(rank + " of ", 0) != 0) {
    message = rank + ": " + message;
  }
  // Into the log (and the run directory's log.txt); where log.level hides errors, to stderr as
  // main() says them, since abort() ends the process before main() could.
  if (spdlog::default_logger()->should_log(spdlog::level::err)) {
    spdlog::error("{}", message);
  } else {
    std::cerr << "gnmr: error: " << message << "\n";
  }
  const int exit_code = gnmr_error ? gnmr_error->exit_code() : int(ErrorKind::Runtime);
  comm.abort(exit_code);
  std::_Exit(exit_code);  // not reached: abort() does not return (GCC cannot see that here)
}

}  // namespace gnmr
