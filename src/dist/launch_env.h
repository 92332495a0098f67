// Who am I in this launch? Rank, world size and local rank as the process launcher tells
// them through environment variables, read before any communicator exists (so "auto" can
// decide between local and mpi, and so a broken launch is caught before MPI starts).
//
// Sources, first match wins (MPI launchers run inside SLURM allocations too, and then the
// SLURM variables describe the allocation, not this process):
//   "mpi"    OpenMPI mpirun:  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                             OMPI_COMM_WORLD_LOCAL_RANK
//            PMI (MPICH Hydra, srun --mpi=pmi2): PMI_RANK, PMI_SIZE,
//                             PMI_LOCAL_RANK or MPI_LOCALRANKID
//   "slurm"  srun:            SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
//                             SLURM_LOCALID
//   "single" none of the above: rank 0 of 1.
// PMIx (srun --mpi=pmix) exports only PMIX_RANK, no size, so that launch is read through
// its SLURM variables.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace gnmr {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;               // -1 when the launcher does not say
  std::string source = "single";    // "single" | "mpi" | "slurm"
  std::string world_size_variable;  // the variable world_size came from, for messages
};

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws Error(ErrorKind::Usage) naming the variable when a value is not a non-negative
// integer, when rank >= world size or local rank >= world size, when world size < 1, or
// when a source is half present (a rank without a size).
LaunchEnv parse_launch_env(const EnvLookup& lookup);

// parse_launch_env over this process's environment.
LaunchEnv read_launch_env();

}  // namespace gnmr
