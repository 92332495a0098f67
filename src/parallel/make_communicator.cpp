#include <spdlog/spdlog.h>

#include <memory>

#include "parallel/communicator.h"
#include "parallel/launch_env.h"
#include "parallel/local_communicator.h"
#ifdef GNMR_WITH_MPI
#include "parallel/mpi_communicator.h"
#endif
#ifdef GNMR_WITH_NCCL
#include "parallel/nccl_communicator.h"
#endif
#include "util/error.h"

namespace gnmr {

namespace {

std::string describe(const LaunchEnv& env) {
  return std::to_string(env.world_size) + " processes (" + env.world_size_variable + ")";
}

#ifdef GNMR_WITH_MPI
// The launcher and MPI must agree; an srun step whose MPI has no PMI plugin, for instance,
// starts N singletons that each see a world of one.
void check_matches_launch(const Communicator& comm, const LaunchEnv& env) {
  if (env.source == "single") return;
  if (comm.world_size() != env.world_size || comm.rank() != env.rank) {
    throw Error(ErrorKind::Usage,
                "launch environment says rank " + std::to_string(env.rank) + " of " +
                    describe(env) + " but MPI sees rank " + std::to_string(comm.rank()) + " of " +
                    std::to_string(comm.world_size()) +
                    "; start gnmr through mpirun, or through srun with an MPI plugin "
                    "(srun --mpi=pmix), one process per GPU");
  }
}
#endif

#ifdef GNMR_WITH_NCCL
// Rank 0's unique id on every rank: over MPI when an MPI launcher started the job (that
// communicator is kept for abort), else over the TCP or file rendezvous (docs/DESIGN.md §7).
std::unique_ptr<Communicator> make_nccl(const CommunicatorOptions& options, const LaunchEnv& env) {
  NcclCommunicatorOptions nccl;
  nccl.rank = env.rank;
  nccl.world_size = env.world_size;
  nccl.local_rank = env.local_rank < 0 ? 0 : env.local_rank;
  nccl.device = options.cuda_device;
  nccl.stream = options.cuda_stream;
  nccl.timeout_s = options.timeout_s;
  if (env.source == "mpi") {
#ifdef GNMR_WITH_MPI
    auto host = std::make_unique<MpiCommunicator>();
    check_matches_launch(*host, env);
    // Rank 0 failing to make the id ends the job at once instead of leaving the others in the
    // id's broadcast (as the communicator's own creation does, nccl_communicator.cpp).
    nccl.unique_id =
        run_or_end_job(*host, [&] { return share_nccl_unique_id(env, options, host.get()); });
    nccl.local_rank = host->local_rank();
    nccl.host = std::move(host);
#else
    throw Error(ErrorKind::NotBuilt,
                "an MPI launcher started " + describe(env) +
                    ", but this gnmr has no MPI (-DGNMR_MPI=OFF) to hand out the NCCL id; "
                    "launch with srun or torchrun instead (they need no MPI)");
#endif
  } else {
    nccl.unique_id = share_nccl_unique_id(env, options, nullptr);
  }
  return make_nccl_communicator(std::move(nccl));
}
#endif

}  // namespace

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options) {
  return make_communicator(options, read_launch_env());
}

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options,
                                                const LaunchEnv& env) {
  const std::string& kind = options.kind;
  if (kind == "local" || (kind == "auto" && env.world_size == 1)) {
    if (env.world_size > 1) {
      throw Error(ErrorKind::Usage,
                  "communicator \"local\" was asked for, but the launcher started " +
                      describe(env) +
                      " and each would train alone; use \"auto\", or launch one process");
    }
    return std::make_unique<LocalCommunicator>();
  }
  const bool on_gpu = options.backend == "cuda";
  if (kind == "nccl" || (kind == "auto" && on_gpu)) {
    if (!on_gpu) {
      throw Error(ErrorKind::Usage, "communicator \"nccl\" sums GPU memory, but the backend is \"" +
                                        options.backend +
                                        "\"; use \"mpi\" (or \"auto\") with backend cpu");
    }
#ifdef GNMR_WITH_NCCL
    return make_nccl(options, env);
#else
    throw Error(ErrorKind::NotBuilt,
                "communicator \"nccl\" is not in this gnmr (built without NCCL: -DGNMR_NCCL=OFF, "
                "or nccl.h / libnccl not found at build time); rebuild with NCCL");
#endif
  }
  if (kind == "mpi" || kind == "auto") {
    if (on_gpu) {
      throw Error(ErrorKind::Usage,
                  "communicator \"mpi\" sums host memory, but the backend is \"cuda\"; use "
                  "\"nccl\" (or \"auto\") for GPU ranks");
    }
#ifdef GNMR_WITH_MPI
    // Debian's Open MPI aborts in MPI_Init there, in words that do not name the fix.
    if (const std::string hint = srun_without_mpi_plugin_hint(env);
        !hint.empty() && env.rank == 0) {
      spdlog::warn("{}", hint);
    }
    auto comm = std::make_unique<MpiCommunicator>();
    check_matches_launch(*comm, env);
    return comm;
#else
    throw Error(ErrorKind::NotBuilt,
                "communicator \"mpi\" is not in this gnmr (built with "
                "-DGNMR_MPI=OFF); the launcher started " +
                    describe(env) + ". Use a build with MPI");
#endif
  }
  throw Error(ErrorKind::Usage,
              "unknown communicator \"" + kind + "\" (expected auto, local, mpi or nccl)");
}

}  // namespace gnmr
