// A rendezvous without MPI (docs/DESIGN.md §7): rank 0 hands the same bytes (the NCCL unique
// id) to every rank of a job that MPI did not start (srun without PMIx, torchrun). Two ways,
// one contract, chosen by dist.rendezvous:
//   "tcp"   rank 0 listens on a port, the others connect (tcp_rendezvous.h);
//   "file"  files named after the job and the attempt in a directory every node shares, for
//           sites that open no port between nodes (file_rendezvous.h).
// Either way every wait has the deadline timeout_s, and a rank that does not join makes every
// rank throw Error(Runtime) naming what is missing; nobody hangs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gnmr {

struct LaunchEnv;

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string method = "tcp";      // dist.rendezvous: "tcp" | "file"
  std::string host = "127.0.0.1";  // tcp: rank 0's address (MASTER_ADDR)
  int port = 29500;                // tcp: MASTER_PORT
  std::string directory;           // file: dist.rendezvous_dir, on a filesystem every rank shares
  std::string job_id;              // SLURM_JOB_ID or any string the ranks share
  // file: which start of the job this is (LaunchEnv::attempt; a SLURM requeue keeps the job id
  // and counts SLURM_RESTART_COUNT up), so an earlier attempt's files are never read.
  std::string attempt = "restart0";
  double timeout_s = 60.0;
};

// Rank 0 passes `payload` (at most 1 MiB); every rank returns rank 0's payload. Dispatches on
// options.method to tcp_rendezvous_broadcast or file_rendezvous_broadcast.
std::vector<uint8_t> rendezvous_broadcast(const RendezvousOptions& options,
                                          const std::vector<uint8_t>& payload);

// The options for this launch: rank, world, job id and attempt from env, the address (tcp) or
// the directory (file), the deadline. Throws Error(Usage) naming the fix when the method needs
// what the launch does not say: tcp without rank 0's address (MASTER_ADDR or a SLURM node
// list), file without a directory or without a job id (SLURM_JOB_ID or TORCHELASTIC_RUN_ID:
// without one, two runs in one directory could read each other's files).
RendezvousOptions rendezvous_options_for(const LaunchEnv& env, const std::string& method,
                                         const std::string& directory, double timeout_s);

}  // namespace gnmr
