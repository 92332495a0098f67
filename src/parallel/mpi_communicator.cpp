#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "parallel/mpi_check.h"
#include "parallel/mpi_runtime.h"
#include "parallel/shard_ranges.h"
#include "util/error.h"

namespace gnmr {

namespace {

const char* const kCollectiveHint =
    "every rank must make the same communicator calls in the same order; a rank that "
    "failed or skipped one leaves the others mismatched";

}  // namespace

MpiCommunicator::MpiCommunicator(size_t max_elements_per_call)
    : max_elements_per_call_(max_elements_per_call) {
  GNMR_CHECK(max_elements_per_call_ >= 1 &&
                 max_elements_per_call_ <= static_cast<size_t>(std::numeric_limits<int>::max()),
             "max_elements_per_call must be in [1, INT_MAX] because MPI counts are int");
  MpiRuntime::ensure_initialized();
  GNMR_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "");
  GNMR_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "");
  GNMR_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), "");
  GNMR_MPI_CHECK(MPI_Comm_size(comm_, &world_size_), "");
  // The local rank is the rank among the processes that share this node's memory: it is
  // what picks the GPU, and asking MPI avoids trusting launcher variables for it.
  MPI_Comm node_comm = MPI_COMM_NULL;
  GNMR_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm),
                 "");
  GNMR_MPI_CHECK(MPI_Comm_rank(node_comm, &local_rank_), "");
  GNMR_MPI_CHECK(MPI_Comm_free(&node_comm), "");
  pending_sums_ = std::make_unique<MpiPendingSums>(comm_, max_elements_per_call_);
  pending_reduce_scatters_ =
      std::make_unique<MpiPendingReduceScatters>(comm_, max_elements_per_call_);
}

// A destructor cannot report errors, and after MPI_Finalize no MPI call is allowed, so the
// communicator is released only while MPI is still up and the return code is dropped.
MpiCommunicator::~MpiCommunicator() {
  pending_sums_.reset();  // their communicators are duplicates of comm_: free them first
  pending_reduce_scatters_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

// Why reduce-then-broadcast and not MPI_Allreduce: MPI_Allreduce in common implementations
// does hand every rank the same bits, but the MPI standard does not promise it (each rank
// may combine the partial sums in its own order, and float addition is not associative).
// Summing at rank 0 and broadcasting its buffer makes every rank hold a copy of the same
// bytes by construction, so replicated weights cannot drift apart. The price is about twice
// the traffic of a ring allreduce, small beside CPU compute; the nccl communicator will
// make its own choice. The summation order at rank 0 is fixed by the MPI library's
// algorithm for a given world size and message size, so reruns of a launch reproduce.
void MpiCommunicator::sum_in_place(void* data, size_t count, MPI_Datatype datatype,
                                   size_t element_bytes) {
  auto* bytes = static_cast<char*>(data);
  for (size_t first = 0; first < count; first += max_elements_per_call_) {
    const int n = static_cast<int>(std::min(max_elements_per_call_, count - first));
    void* chunk = bytes + first * element_bytes;
    if (rank_ == 0) {
      GNMR_MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, chunk, n, datatype, MPI_SUM, 0, comm_),
                     kCollectiveHint);
    } else {
      GNMR_MPI_CHECK(MPI_Reduce(chunk, nullptr, n, datatype, MPI_SUM, 0, comm_), kCollectiveHint);
    }
    GNMR_MPI_CHECK(MPI_Bcast(chunk, n, datatype, 0, comm_), kCollectiveHint);
  }
}

void MpiCommunicator::allreduce_sum(Tensor& tensor) {
  GNMR_CHECK(
      tensor.dtype == DType::F32 || tensor.dtype == DType::F64,
      std::string("allreduce_sum takes F32 or F64 tensors, got ") + dtype_name(tensor.dtype));
  const auto count = static_cast<size_t>(tensor.numel());
  if (count == 0) return;
  GNMR_CHECK(tensor.data != nullptr, "allreduce_sum of an unallocated tensor");
  if (tensor.dtype == DType::F64) {
    allreduce_sum(static_cast<double*>(tensor.data), count);
    return;
  }
  sum_in_place(tensor.data, count, MPI_FLOAT, sizeof(float));
}

void MpiCommunicator::start_allreduce_sum(Tensor tensor) {
  GNMR_CHECK(tensor.dtype == DType::F32,
             std::string("start_allreduce_sum takes F32 tensors, got ") + dtype_name(tensor.dtype));
  const auto count = static_cast<size_t>(tensor.numel());
  if (count == 0) return;
  GNMR_CHECK(tensor.data != nullptr, "start_allreduce_sum of an unallocated tensor");
  pending_sums_->start(static_cast<float*>(tensor.data), count);
}

void MpiCommunicator::allreduce_sum(double* values, size_t count) {
  if (count == 0) return;
  sum_in_place(values, count, MPI_DOUBLE, sizeof(double));
}

namespace {

// reduce_scatter_sum packs at most this many floats per call into each scratch buffer.
constexpr size_t kReduceScatterScratchElements = size_t{1} << 20;

}  // namespace

// Why not MPI_Reduce_scatter_block: like MPI_Allreduce, it leaves the order of the additions
// to the library. Here each rank receives every rank's copy of its own shard (MPI_Alltoall
// of packed blocks, a chunk of the shard at a time) and adds them itself in rank order, so the
// sum is fixed by the world size alone. For two ranks it equals the plain path's reduce (fp32
// addition is commutative); for three or more it may differ from it in the last bit.
void MpiCommunicator::reduce_scatter_sum(Tensor& tensor) {
  const size_t shard = shard_elements(tensor, world_size_, "reduce_scatter_sum");
  if (shard == 0) return;
  auto* data = static_cast<float*>(tensor.data);
  float* own = data + size_t(rank_) * shard;
  const size_t world = size_t(world_size_);
  const size_t per_call = std::min(max_elements_per_call_, kReduceScatterScratchElements);
  const size_t chunk = std::max<size_t>(1, per_call / world);
  send_scratch_.resize(world * std::min(chunk, shard));
  receive_scratch_.resize(send_scratch_.size());
  for (size_t first = 0; first < shard; first += chunk) {
    const size_t n = std::min(chunk, shard - first);
    for (size_t r = 0; r < world; ++r) {
      std::copy(data + r * shard + first, data + r * shard + first + n,
                send_scratch_.data() + r * n);
    }
    GNMR_MPI_CHECK(MPI_Alltoall(send_scratch_.data(), int(n), MPI_FLOAT, receive_scratch_.data(),
                                int(n), MPI_FLOAT, comm_),
                   kCollectiveHint);
    for (size_t i = 0; i < n; ++i) {
      float sum = receive_scratch_[i];
      for (size_t r = 1; r < world; ++r) sum += receive_scratch_[r * n + i];
      own[first + i] = sum;
    }
  }
}

// One broadcast per rank (each chunked like broadcast()): the same traffic as MPI_Allgather,
// and a copy is exact whatever the library does.
void MpiCommunicator::start_reduce_scatter_sum(Tensor tensor, int64_t begin, int64_t end) {
  const size_t shard = shard_elements(tensor, world_size_, "start_reduce_scatter_sum");
  check_element_range(tensor, begin, end, "start_reduce_scatter_sum");
  pending_reduce_scatters_->start(static_cast<float*>(tensor.data), shard, size_t(begin),
                                  size_t(end));
}

void MpiCommunicator::progress() {
  pending_sums_->progress();
  pending_reduce_scatters_->progress();
}

void MpiCommunicator::wait_all() {
  pending_sums_->wait_all();
  pending_reduce_scatters_->wait_all();
}

void MpiCommunicator::all_gather(Tensor& tensor) {
  const size_t shard = shard_elements(tensor, world_size_, "all_gather");
  auto* data = static_cast<float*>(tensor.data);
  for (int r = 0; r < world_size_; ++r) {
    broadcast(data + size_t(r) * shard, shard * sizeof(float), r);
  }
}

void MpiCommunicator::broadcast(void* host_bytes, size_t bytes, int root) {
  GNMR_CHECK(root >= 0 && root < world_size_, "broadcast root " + std::to_string(root) +
                                                  " is not a rank of a world of " +
                                                  std::to_string(world_size_));
  auto* data = static_cast<char*>(host_bytes);
  for (size_t first = 0; first < bytes; first += max_elements_per_call_) {
    const int n = static_cast<int>(std::min(max_elements_per_call_, bytes - first));
    GNMR_MPI_CHECK(MPI_Bcast(data + first, n, MPI_BYTE, root, comm_), kCollectiveHint);
  }
}

void MpiCommunicator::barrier() {
  GNMR_MPI_CHECK(MPI_Barrier(comm_), kCollectiveHint);
}

// One collective answers both "what is the largest value" and "what is the smallest":
// max(~v) over ranks is ~min(v), so all values agree exactly when max(v) == ~max(~v).
// Integer max is exact, so every rank reaches the same answer.
bool MpiCommunicator::all_agree(uint64_t value) {
  uint64_t extremes[2] = {value, ~value};
  GNMR_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UINT64_T, MPI_MAX, comm_),
                 kCollectiveHint);
  return extremes[0] == ~extremes[1];
}

void MpiCommunicator::abort(int exit_code) {
  MPI_Abort(comm_, exit_code);
  std::_Exit(exit_code);  // MPI_Abort should not return; if it does, still end this rank
}

}  // namespace gnmr
