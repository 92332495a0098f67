#include "parallel/mpi_check.h"

#include <mpi.h>

#include "util/error.h"

namespace gnmr {

void fail_mpi_call(int code, const char* call, const char* file, int line,
                   const std::string& hint) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  // MPI_Error_string may itself fail after a broken init; then the code is all we have.
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  std::string what = length > 0 ? std::string(text, static_cast<size_t>(length))
                                : "MPI error code " + std::to_string(code);
  throw Error(ErrorKind::Runtime, std::string("MPI: ") + call + " failed at " + file + ":" +
                                      std::to_string(line) + ": " + what +
                                      (hint.empty() ? "" : " — " + hint));
}

}  // namespace gnmr
