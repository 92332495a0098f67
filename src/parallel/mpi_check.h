// GNMR_MPI_CHECK: every MPI call goes through it. A failing call throws
// gnmr::Error(ErrorKind::Runtime) naming the call, file, line, MPI's own message and a hint.
// (Errors come back as return codes only on communicators whose error handler is
// MPI_ERRORS_RETURN; MpiCommunicator sets that on its own communicator.)
#pragma once

#include <string>

namespace gnmr {

[[noreturn]] void fail_mpi_call(int code, const char* call, const char* file, int line,
                                const std::string& hint);

}  // namespace gnmr

#define GNMR_MPI_CHECK(call, hint)                                              \
  do {                                                                          \
    const int gnmr_mpi_code_ = (call);                                          \
    if (gnmr_mpi_code_ != MPI_SUCCESS)                                          \
      ::gnmr::fail_mpi_call(gnmr_mpi_code_, #call, __FILE__, __LINE__, (hint)); \
  } while (0)
