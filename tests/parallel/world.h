// The communicator the test binary was launched with: mpi under `mpirun -np 2`, local when
// run as a single process. Made once in mpi_test_main.cpp, because MPI starts once per
// process; tests that need two ranks skip in a world of one.
#pragma once

#include "parallel/communicator.h"

namespace gnmr_test {

gnmr::Communicator& world();

}  // namespace gnmr_test
