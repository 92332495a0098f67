// Data parallelism over NCCL for GPU ranks (docs/DESIGN.md §7). Gradients and the step's
// loss sum are reduced in device memory on the CUDA backend's stream, so a collective is
// ordered after the backward that produced its input and before the update that reads it,
// with no host wait in between. The overlapped gradient reductions (start_allreduce_sum,
// start_reduce_scatter_sum) run on a second, high-priority stream that follows the backend's
// stream through an event at each start, and wait_all() makes the backend's stream wait for it:
// the host never waits for communication during backward. ZeRO-1 (dist.zero=1) reduce-scatters
// and all-gathers in place with ncclReduceScatter / ncclAllGather, or per bucket with grouped
// ncclReduce calls to each shard's owner (parallel/shard_ranges.h). The host collectives of the
// seam (a config hash, a checkpoint decision, evaluation sums) go through the same communicator via
// a small device staging buffer, so a job launched without MPI needs nothing but NCCL once the
// unique id is shared.
//
// Nothing hangs: the communicator is non-blocking, and every wait (creation, each host
// collective, wait_for_collectives before the step's readback) polls the device and NCCL's
// asynchronous error up to `timeout_s`. On an error or timeout the communicator is aborted
// (unless MPI will end the process) and Error(Runtime) names this rank and the collective;
// run_or_end_job (communicator.h) then ends the job through abort(), which also takes down the
// other ranks when a host communicator (MPI) is present, and otherwise leaves them to fail their
// own next wait within the same deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace gnmr {

constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES (checked against nccl.h)

// NCCL's unique id, made on rank 0 and handed to every
// rank before the communicator exists. ncclGetUniqueId needs no GPU. Error(Runtime) naming
// NCCL's message when it fails (e.g. no usable network interface).
std::vector<uint8_t> make_nccl_unique_id();

struct LaunchEnv;

// Rank 0's make_nccl_unique_id() on every rank: broadcast through `host` (MPI) when given, else
// through the rendezvous options.rendezvous names (rendezvous.h: TCP at env's address, or files
// in options.rendezvous_dir), each with the deadline options.timeout_s. Error(Usage) when there
// is no host communicator and the rendezvous lacks what it needs (an address, a directory, a
// job id).
std::vector<uint8_t> share_nccl_unique_id(const LaunchEnv& env, const CommunicatorOptions& options,
                                          Communicator* host);

struct NcclCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::vector<uint8_t> unique_id;  // rank 0's make_nccl_unique_id(), the same on every rank
  int device = 0;                  // the CUDA backend's device
  void* stream = nullptr;          // the CUDA backend's cudaStream_t
  double timeout_s = 600.0;        // dist.timeout_s: the deadline of every wait
  // The communicator that handed out the id (MPI), kept for abort(); null after a TCP or
  // file rendezvous.
  std::unique_ptr<Communicator> host;
};

// Creates the NCCL communicator (waiting, up to the deadline, for every rank to join).
std::unique_ptr<Communicator> make_nccl_communicator(NcclCommunicatorOptions options);

}  // namespace gnmr
