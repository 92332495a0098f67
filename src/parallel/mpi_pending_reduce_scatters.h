// The non-blocking ZeRO-1 gradient reduction of MpiCommunicator (start_reduce_scatter_sum /
// progress / wait_all): each gradient bucket's reduce-scatter in flight while backward runs
// (docs/DESIGN.md §7).
//
// The buffer is the flat gradient, [world * shard] floats, shard r owned by rank r
// (train/zero_shards.h). A bucket [begin, end) is one MPI_Ialltoallv: rank r's copy of the
// bucket's intersection with shard s goes to rank s (zero counts where they do not meet). When it
// completes, this rank adds the world's copies of its part of the bucket in rank order,
// ((x_0 + x_1) + x_2) + ..., exactly as the blocking reduce_scatter_sum does, so a bucketed
// reduction gives the unbucketed one's bits for any world size and any bucket boundaries. Why
// not MPI_Ireduce_scatter: like MPI_Allreduce it leaves the order of the additions to the
// library, which may change it with the message size, i.e. with the buckets.
//
// The copies arrive in a ring of scratch floats (8 × max_elements_per_call, at most 2^24 =
// 64 MiB): buckets take it in start order and give it back in start order once summed; a bucket
// that finds it full first waits for the oldest. A bucket longer than max_elements_per_call or
// than ring / world elements is several calls, cut the same way on every rank.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <deque>
#include <vector>

namespace gnmr {

class MpiPendingReduceScatters {
 public:
  // comm: the communicator whose ranks reduce (duplicated here, freed in the destructor).
  MpiPendingReduceScatters(MPI_Comm comm, size_t max_elements_per_call);
  ~MpiPendingReduceScatters();
  MpiPendingReduceScatters(const MpiPendingReduceScatters&) = delete;
  MpiPendingReduceScatters& operator=(const MpiPendingReduceScatters&) = delete;

  // Starts the reduce-scatter of elements [begin, end) of data ([world * shard] floats): once
  // complete, this rank's shard elements in [begin, end) hold the rank-order sum of the ranks'
  // copies. Nothing in [begin, end) may be touched until then.
  void start(float* data, size_t shard, size_t begin, size_t end);
  // Tests the oldest pending reductions (Open MPI moves non-blocking collectives forward only
  // inside MPI calls) and sums those that have completed, in start order.
  void progress();
  // Returns when every started reduction is complete and summed.
  void wait_all();
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    float* own;         // where this rank's part of the piece starts in data
    size_t own_count;   // its length (0: this rank owns nothing of the piece)
    size_t scratch_at;  // the world's copies: scratch_[scratch_at + s * own_count + i]
    MPI_Request request;
    std::vector<int> counts;  // send counts, send displacements, receive counts, receive
                              // displacements: MPI reads them until the call completes
  };
  void start_piece(float* data, size_t shard, size_t begin, size_t end);
  // Where in the ring `count` floats fit now, or npos when they do not.
  size_t ring_place(size_t count) const;
  void finish_oldest(bool wait);  // tests (or waits for) the oldest; sums it when complete

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_size_ = 1;
  size_t max_elements_per_call_;
  size_t ring_capacity_;
  std::vector<float> scratch_;   // the ring
  size_t ring_head_ = 0;         // where the newest piece's copies end
  std::deque<Pending> pending_;  // in start order
};

}  // namespace gnmr
