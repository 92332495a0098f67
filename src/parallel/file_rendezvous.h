// The file rendezvous (rendezvous.h, dist.rendezvous=file): for sites that open no port
// between nodes but share a filesystem. docs/DESIGN.md §7.
//
// In options.directory, every file is named after the job and the attempt,
//   gnmr-rendezvous.<job id>.<attempt>.join.<rank>  rank r >= 1: "I am here"
//   gnmr-rendezvous.<job id>.<attempt>.payload      rank 0: the bytes, once every rank joined
//   gnmr-rendezvous.<job id>.<attempt>.ack.<rank>   rank r >= 1: "I have read the payload"
//   gnmr-rendezvous.<job id>.<attempt>.fail         rank 0: why it gave up (the missing ranks)
// so a file of another job, or of an earlier attempt of this one (a SLURM requeue keeps the
// job id; the attempt counts SLURM_RESTART_COUNT), is never opened. Each file is written to a
// temporary name, fsync'd and renamed, so a reader sees all of it or nothing, and carries the
// format version, kind, job id, attempt, world size and writer's rank, all checked on read: a
// file under this job's name that disagrees (another world size, another format) is an error
// naming the file and the field, not a silent mix.
//
// Nothing hangs: every wait polls until the deadline timeout_s (a joined rank waits 2 s longer
// for rank 0's verdict). Rank 0 waits for every join file; if one is missing at the deadline it
// writes the fail file naming the missing ranks, and every rank throws Error(Runtime) naming
// them (rank 0, and those that read the fail file) or what it waited for (a rank that saw
// neither payload nor fail file). After writing the payload rank 0 waits, again up to
// timeout_s, for every rank's ack and then removes the job's files; when an ack is missing it
// leaves them and logs a warning naming the ranks and the directory. A directory that does not
// exist or that this rank cannot write is Error(Usage) before any waiting.
//
// The filesystem must make a renamed file visible to the other nodes: NFS does, after its
// attribute cache expires (acdirmin, seconds), so keep dist.timeout_s well above that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/rendezvous.h"

namespace gnmr {

// Rank 0 passes `payload`; every rank returns rank 0's payload (at most 1 MiB). Reads
// options.directory, job_id, attempt and timeout_s.
std::vector<uint8_t> file_rendezvous_broadcast(const RendezvousOptions& options,
                                               const std::vector<uint8_t>& payload);

// The name of one rendezvous file (without the directory), as the list above spells it: the
// job id and attempt with every character outside [A-Za-z0-9._-] replaced by '_'. rank < 0:
// the kinds without a rank (payload, fail). For tests that plant files.
std::string file_rendezvous_name(const std::string& job_id, const std::string& attempt,
                                 const std::string& kind, int rank);

// The full text of one rendezvous file (header and body), for tests that plant files.
std::string file_rendezvous_contents(const std::string& kind, const std::string& job_id,
                                     const std::string& attempt, int world_size, int rank,
                                     const std::vector<uint8_t>& body);

}  // namespace gnmr
