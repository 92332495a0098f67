// The world of one process: sums and broadcasts over one rank leave the data as it is.
#pragma once

#include "parallel/communicator.h"

namespace gnmr {

class LocalCommunicator final : public Communicator {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }

  void allreduce_sum(Tensor& tensor) override;
  void allreduce_sum(double* values, size_t count) override {}
  void reduce_scatter_sum(Tensor& tensor) override;  // one shard: already its own sum
  void all_gather(Tensor& tensor) override;
  void broadcast(void* host_bytes, size_t bytes, int root) override;
  void barrier() override {}
  bool all_agree(uint64_t value) override { return true; }
  [[noreturn]] void abort(int exit_code) override;
};

}  // namespace gnmr
