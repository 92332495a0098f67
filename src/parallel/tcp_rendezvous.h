// The TCP rendezvous (rendezvous.h, dist.rendezvous=tcp): rank 0 listens on a TCP port, every
// other rank connects and says who it is (job id, rank, world size), and once all have joined
// rank 0 sends each the same bytes (the NCCL unique id, when the NCCL communicator takes it
// over a cluster whose MPI has no working PMIx/PMI2). docs/DESIGN.md §7.
//
// Nothing hangs: every wait has the deadline `timeout_s` (a joined rank waits 2 s longer for
// rank 0's answer, so that rank 0's verdict reaches it). If a rank has not joined by then,
// rank 0 tells the ranks that did that the rendezvous failed, and every rank throws
// Error(Runtime) naming the missing ranks (rank 0) or what it waited for (the others). A
// connection from another job (another job id) or a second claim on a rank is refused and
// named; it cannot take a rank's place.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/rendezvous.h"

namespace gnmr {

// Rank 0 passes `payload`; every rank returns rank 0's payload (at most 1 MiB). Reads
// options.host, port, job_id and timeout_s.
std::vector<uint8_t> tcp_rendezvous_broadcast(const RendezvousOptions& options,
                                              const std::vector<uint8_t>& payload);

}  // namespace gnmr
