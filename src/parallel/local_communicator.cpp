#include "parallel/local_communicator.h"

#include <cstdlib>

#include "util/error.h"

namespace gnmr {

// A no-op, but it holds the tensor to the same contract as the other communicators, so a
// dtype mistake shows up in a one-process run and not first on a cluster.
void LocalCommunicator::allreduce_sum(Tensor& tensor) {
  GNMR_CHECK(
      tensor.dtype == DType::F32 || tensor.dtype == DType::F64,
      std::string("allreduce_sum takes F32 or F64 tensors, got ") + dtype_name(tensor.dtype));
}

void LocalCommunicator::reduce_scatter_sum(Tensor& tensor) {
  GNMR_CHECK(tensor.dtype == DType::F32,
             std::string("reduce_scatter_sum takes F32 tensors, got ") + dtype_name(tensor.dtype));
}

void LocalCommunicator::all_gather(Tensor& tensor) {
  GNMR_CHECK(tensor.dtype == DType::F32,
             std::string("all_gather takes F32 tensors, got ") + dtype_name(tensor.dtype));
}

void LocalCommunicator::broadcast(void* host_bytes, size_t bytes, int root) {
  GNMR_CHECK(root == 0,
             "broadcast root " + std::to_string(root) + " is not a rank of a world of 1");
}

void LocalCommunicator::abort(int exit_code) {
  std::exit(exit_code);
}

}  // namespace gnmr
