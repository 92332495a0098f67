#include "parallel/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>

#include "parallel/mpi_check.h"
#include "util/error.h"

namespace gnmr {

void MpiRuntime::ensure_initialized() {
  static MpiRuntime runtime;  // thread-safe one-time construction (C++11 magic statics)
}

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  GNMR_MPI_CHECK(MPI_Initialized(&initialized), "");
  if (initialized) return;
  // The overlapped gradient sum's MPI_Ireduce (mpi_pending_sums.h): for large messages
  // Open MPI 4.1's libnbc picks a segmented chain by default, measured ~3x slower than the
  // blocking reduce on shared memory (2.2 s against 0.7 s for 232 MB over 2 ranks, and the
  // overlap then costs more than it hides); its binomial tree ("2") is within ~1.3x. Only
  // that sum uses MPI_Ireduce. A value set by the user wins (no overwrite); other MPI
  // libraries ignore the variable.
  setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", /*overwrite=*/0);
  int provided = MPI_THREAD_SINGLE;
  GNMR_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                 "MPI could not start; launch gnmr with mpirun or srun");
  owns_mpi_ = true;
  if (provided < MPI_THREAD_FUNNELED) {
    throw Error(ErrorKind::Runtime,
                "MPI: this MPI library offers no MPI_THREAD_FUNNELED support, which gnmr "
                "needs because OpenMP threads run beside the thread that calls MPI");
  }
}

// Runs at process exit. Errors cannot be reported from here (throwing would terminate),
// so return codes are deliberately dropped.
MpiRuntime::~MpiRuntime() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace gnmr
