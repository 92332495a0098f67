#include <memory>

#include "dist/communicator.h"
#include "dist/launch_env.h"
#include "dist/local_communicator.h"
#ifdef GNMR_WITH_MPI
#include "dist/mpi_communicator.h"
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

}  // namespace

std::unique_ptr<Communicator> make_communicator(const std::string& kind) {
  return make_communicator(kind, read_launch_env());
}

std::unique_ptr<Communicator> make_communicator(const std::string& kind, const LaunchEnv& env) {
  if (kind == "local" || (kind == "auto" && env.world_size == 1)) {
    if (env.world_size > 1) {
      throw Error(
          ErrorKind::Usage,
          "communicator \"local\" was asked for, but the launcher started " + describe(env) +
              " and each would train alone; use \"auto\" or \"mpi\", or launch one process");
    }
    return std::make_unique<LocalCommunicator>();
  }
  if (kind == "mpi" || kind == "auto") {
#ifdef GNMR_WITH_MPI
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
  if (kind == "nccl") {
    // The seam for GPU data parallelism: an NcclCommunicator will take its unique id over
    // an MpiCommunicator's broadcast once the CUDA backend exists.
    throw Error(ErrorKind::NotBuilt,
                "communicator \"nccl\" is not built yet (it needs the CUDA backend); use \"mpi\"");
  }
  throw Error(ErrorKind::Usage,
              "unknown communicator \"" + kind + "\" (expected auto, local, mpi or nccl)");
}

}  // namespace gnmr
