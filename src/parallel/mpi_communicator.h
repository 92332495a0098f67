// Data parallelism over MPI for CPU ranks (also, later, the channel that hands out the NCCL
// unique id). Works on its own duplicate of MPI_COMM_WORLD so no other MPI user in the
// process can mix messages with ours, and with MPI_ERRORS_RETURN so failures become
// gnmr::Error instead of an abort without context.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/mpi_pending_reduce_scatters.h"
#include "parallel/mpi_pending_sums.h"

namespace gnmr {

class MpiCommunicator final : public Communicator {
 public:
  // A single MPI call moves at most `max_elements_per_call` elements: MPI counts are `int`,
  // and a bounded chunk also bounds the scratch buffers MPI allocates per call
  // (2^26 floats = 256 MiB). Tests pass a tiny value to exercise the chunking.
  static constexpr size_t kDefaultMaxElementsPerCall = size_t{1} << 26;

  explicit MpiCommunicator(size_t max_elements_per_call = kDefaultMaxElementsPerCall);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }

  // tensor.data must be host memory (cpu backend).
  void allreduce_sum(Tensor& tensor) override;
  void allreduce_sum(double* values, size_t count) override;
  // Non-blocking gradient sums: mpi_pending_sums.h (why Ireduce + Ibcast, on their own
  // communicators).
  void start_allreduce_sum(Tensor tensor) override;
  void progress() override;
  void wait_all() override;
  void reduce_scatter_sum(Tensor& tensor) override;
  // Non-blocking ZeRO-1 buckets: mpi_pending_reduce_scatters.h (MPI_Ialltoallv and a rank-order
  // sum, on their own communicator).
  void start_reduce_scatter_sum(Tensor tensor, int64_t begin, int64_t end) override;
  void all_gather(Tensor& tensor) override;
  void broadcast(void* host_bytes, size_t bytes, int root) override;
  void barrier() override;
  bool all_agree(uint64_t value) override;
  [[noreturn]] void abort(int exit_code) override;

 private:
  // Sum of `count` elements of `datatype` at `data` over all ranks, in place, identical
  // bits everywhere (see the .cpp for why it is reduce + broadcast).
  void sum_in_place(void* data, size_t count, MPI_Datatype datatype, size_t element_bytes);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  size_t max_elements_per_call_;
  std::unique_ptr<MpiPendingSums> pending_sums_;
  std::unique_ptr<MpiPendingReduceScatters> pending_reduce_scatters_;
  std::vector<float> send_scratch_, receive_scratch_;  // reduce_scatter_sum's packed blocks
};

}  // namespace gnmr
