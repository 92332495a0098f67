// MPI may be initialised and finalised once per process, so that is the one thing in parallel/
// that is process-wide: the first MpiCommunicator calls MpiRuntime::ensure_initialized(),
// which builds a function-local static guard; the guard's destructor runs MPI_Finalize at
// process exit. Communicators must be destroyed before then (i.e. not held in statics).
#pragma once

namespace gnmr {

class MpiRuntime {
 public:
  // MPI_Init_thread(MPI_THREAD_FUNNELED) on the first call: only the thread that called it
  // makes MPI calls, while OpenMP threads do the math. Does nothing if someone else
  // (a test harness, a host application) already initialised MPI; then it is theirs to
  // finalise. Throws Error(Runtime) when MPI cannot start or lacks FUNNELED support.
  static void ensure_initialized();

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  MpiRuntime();
  ~MpiRuntime();

  bool owns_mpi_ = false;
};

}  // namespace gnmr
