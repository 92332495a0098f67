// The non-blocking half of MpiCommunicator (start_allreduce_sum / progress / wait_all): sums
// of gradient buckets in flight while backward runs (docs/DESIGN.md §7).
//
// Each sum is, like the blocking one, a reduce to rank 0 then a broadcast of rank 0's
// buffer, here MPI_Ireduce then MPI_Ibcast. Why not MPI_Iallreduce: the standard does not
// promise every rank the same bits (each may combine partial sums in its own order), while a
// broadcast copies one buffer, so every rank holds the same bytes by construction. For two
// ranks every element is one addition a + b, the same whatever the library's algorithm or the
// bucket boundaries, so the bucketed sum also equals the blocking one bit for bit; with more
// ranks the library may pick another reduction tree for another message size, and a
// bucketed run may differ from an unbucketed one in the last bits (still identical on
// every rank).
//
// The broadcast of a bucket may start only once its reduce is complete on this rank (the
// buffer is the reduce's output on rank 0, its input elsewhere). When that happens differs
// between ranks, and MPI requires every rank to issue the collectives of a communicator in
// the same order; so reduces and broadcasts go on two communicators of their own, and each
// kind is issued in the order the buckets were started, on every rank.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <deque>

namespace gnmr {

class MpiPendingSums {
 public:
  // comm: the communicator whose ranks sum (duplicated twice here, freed in the destructor).
  // max_elements_per_call as for MpiCommunicator: a longer bucket is several reduces.
  MpiPendingSums(MPI_Comm comm, size_t max_elements_per_call);
  ~MpiPendingSums();
  MpiPendingSums(const MpiPendingSums&) = delete;
  MpiPendingSums& operator=(const MpiPendingSums&) = delete;

  // Starts summing floats [data, data + count) over the ranks, in place.
  void start(float* data, size_t count);
  // Tests the pending operations (Open MPI moves non-blocking collectives forward only inside
  // MPI calls) and starts the broadcasts whose reduce has finished, in start order.
  void progress();
  // Returns when every started sum is complete.
  void wait_all();
  size_t pending() const { return pending_.size(); }

 private:
  enum class Stage { kReducing, kReduced, kBroadcasting, kDone };
  struct Pending {
    float* data;
    int count;
    Stage stage;  // kReduced: reduce complete, broadcast waiting for an earlier one to start
    MPI_Request request;  // of the reduce or the broadcast in flight
  };
  void start_broadcast(Pending& p);

  MPI_Comm reduce_comm_ = MPI_COMM_NULL, broadcast_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  size_t max_elements_per_call_;
  std::deque<Pending> pending_;  // in start order
};

}  // namespace gnmr
