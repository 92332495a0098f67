#include "parallel/rendezvous.h"

#include "parallel/file_rendezvous.h"
#include "parallel/launch_env.h"
#include "parallel/tcp_rendezvous.h"
#include "util/error.h"

namespace gnmr {

std::vector<uint8_t> rendezvous_broadcast(const RendezvousOptions& options,
                                          const std::vector<uint8_t>& payload) {
  if (options.method == "tcp") return tcp_rendezvous_broadcast(options, payload);
  if (options.method == "file") return file_rendezvous_broadcast(options, payload);
  throw Error(ErrorKind::Usage, "unknown rendezvous \"" + options.method +
                                    "\" (dist.rendezvous: expected tcp or file)");
}

RendezvousOptions rendezvous_options_for(const LaunchEnv& env, const std::string& method,
                                         const std::string& directory, double timeout_s) {
  const std::string launch =
      std::to_string(env.world_size) + " processes (" + env.world_size_variable + ") without MPI";
  RendezvousOptions o;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.method = method;
  o.job_id = env.job_id;
  o.attempt = env.attempt;
  o.timeout_s = timeout_s;
  if (method == "tcp") {
    if (env.rendezvous_host.empty()) {
      throw Error(ErrorKind::Usage,
                  "the rendezvous of " + launch +
                      " needs rank 0's address: set MASTER_ADDR (and MASTER_PORT), launch "
                      "with srun (its node list names rank 0's node), or use a shared "
                      "directory (dist.rendezvous=file, dist.rendezvous_dir=DIR)");
    }
    o.host = env.rendezvous_host;
    o.port = env.rendezvous_port;
  } else if (method == "file") {
    if (directory.empty()) {
      throw Error(ErrorKind::Usage,
                  "dist.rendezvous is \"file\" but dist.rendezvous_dir is "
                  "empty; set it to a directory every node shares");
    }
    if (env.job_id.empty()) {
      throw Error(ErrorKind::Usage,
                  "the file rendezvous of " + launch +
                      " needs a job id to name its files (SLURM_JOB_ID, or torchrun's "
                      "TORCHELASTIC_RUN_ID: --rdzv-id), so that two runs sharing " +
                      directory + " never read each other's; launch with srun or set one");
    }
    o.directory = directory;
  } else {
    throw Error(ErrorKind::Usage,
                "unknown rendezvous \"" + method + "\" (dist.rendezvous: expected tcp or file)");
  }
  return o;
}

}  // namespace gnmr
