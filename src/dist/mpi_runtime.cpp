#include "dist/mpi_runtime.h"

#include <mpi.h>

#include "dist/mpi_check.h"
#include "util/error.h"

namespace gnmr {

void MpiRuntime::ensure_initialized() {
  static MpiRuntime runtime;  // thread-safe one-time construction (C++11 magic statics)
}

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  GNMR_MPI_CHECK(MPI_Initialized(&initialized), "");
  if (initialized) return;
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
