// Who am I in this launch? Rank, world size and local rank as the process launcher tells
// them through environment variables, read before any communicator exists (so "auto" can
// decide between local and mpi, and so a broken launch is caught before MPI starts).
//
// Sources, first match wins (MPI launchers run inside SLURM allocations too, and then the
// SLURM variables describe the allocation, not this process):
//   "mpi"    OpenMPI mpirun:  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                             OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//            PMI (MPICH Hydra, srun --mpi=pmi2): PMI_RANK, PMI_SIZE,
//                             PMI_LOCAL_RANK or MPI_LOCALRANKID,
//                             PMI_LOCAL_SIZE or MPI_LOCALNRANKS
//            (mpi and torchrun without a local rank take SLURM_LOCALID when srun started the
//            process itself: SLURM_PROCID equal to the rank)
//   "torchrun" torchrun / torch.distributed.run, or any launcher that sets them:
//                             RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (before SLURM:
//                             torchrun started by srun is the innermost launcher)
//   "slurm"  srun:            SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
//                             SLURM_LOCALID, SLURM_NTASKS_PER_NODE (set only with
//                             --ntasks-per-node)
//   "single" none of the above: rank 0 of 1.
//
// Where rank 0 can be reached, for a rendezvous without MPI (tcp_rendezvous.h): MASTER_ADDR,
// else the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST; SLURM puts rank 0 on
// the step's first node); GNMR_RENDEZVOUS_PORT, else MASTER_PORT (plus one under torchrun, whose
// agent listens on MASTER_PORT itself: TORCHELASTIC_RUN_ID set), else 29500 + SLURM_JOB_ID % 1000
// so two jobs sharing a node rarely pick the same port. The job id (SLURM_JOB_ID, else
// TORCHELASTIC_RUN_ID) keeps ranks of another job from joining. The attempt tells starts of one job
// apart, so that the file rendezvous (file_rendezvous.h) of one start never reads another's files:
// "restart<N>" with N = SLURM_RESTART_COUNT (a requeue keeps the job id and counts this up),
// else TORCHELASTIC_RESTART_COUNT, else 0; then ".step<S>" with S = SLURM_STEP_ID when set (two
// srun steps of one job).
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
  int local_size = 1;               // ranks on this node; -1 when the launcher does not say
  std::string source = "single";    // "single" | "mpi" | "torchrun" | "slurm"
  std::string world_size_variable;  // the variable world_size came from, for messages
  std::string rendezvous_host;      // rank 0's host; "" when the environment does not say
  int rendezvous_port = 29500;
  std::string job_id;                // "" when the launcher does not say
  std::string attempt = "restart0";  // which start of the job: "restart<N>[.step<S>]"
  // Whether the launcher set up a PMIx or PMI-2 wire-up for this process (PMIX_RANK, PMI_RANK,
  // PMI_FD or OMPI_COMM_WORLD_RANK set); srun --mpi=none sets none of them.
  bool mpi_wireup = false;
};

// The first host a SLURM node list names: "gpu[003-010,017],login1" -> "gpu003",
// "rack[1-2]-n[07-08]" -> "rack1-n07", "node5" -> "node5". Throws Error(Usage) naming the
// list when a bracket is not closed or is empty.
std::string first_slurm_host(const std::string& nodelist);

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws Error(ErrorKind::Usage) naming the variable when a value is not a non-negative
// integer, when rank >= world size or local rank >= world size, when world size < 1, when the
// local size is not between 1 and the world size, or when a source is half present (a rank
// without a size).
LaunchEnv parse_launch_env(const EnvLookup& lookup);

// For CPU ranks that srun started without a PMIx or PMI-2 wire-up (srun --mpi=none, or a
// cluster whose MpiDefault is none): what to do if MPI_Init then fails, as Debian's Open MPI
// does ("OMPI was not built with SLURM's PMI support"); "" for any other launch. Only a hint:
// an MPI built with SLURM's PMI-1 (MPICH, Intel MPI) starts there.
std::string srun_without_mpi_plugin_hint(const LaunchEnv& env);

// Which GPU a process of the cuda backend takes among the `visible_gpus` CUDA shows it (after
// CUDA_VISIBLE_DEVICES): device 0 when it sees at most one (a launcher that gives each task its
// own GPU, srun --gpus-per-task=1 or --gpu-bind; none is the device probe's error to report),
// else its local rank. device -1 and `problem` in words when that cannot be: the local rank is
// unknown in a job of several processes, or not below the visible count.
struct GpuChoice {
  int device = 0;
  std::string problem;
};
GpuChoice gpu_for_process(const LaunchEnv& env, int visible_gpus);

// This process's environment variables (std::getenv), as an EnvLookup.
EnvLookup process_environment();

// parse_launch_env over this process's environment.
LaunchEnv read_launch_env();

}  // namespace gnmr
