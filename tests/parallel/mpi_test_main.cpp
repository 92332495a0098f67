// main() for test_parallel. The same binary runs as one process (ctest parallel.single_process) and
// under `mpirun -np 2` (parallel.mpi_two_ranks). Rank 0 prints GoogleTest's usual report; other
// ranks print only their own failures, prefixed with the rank, so a 2-rank log stays
// readable. The exit code is non-zero on every rank if any rank failed.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "tests/parallel/world.h"
#include "util/error.h"

namespace gnmr_test {

namespace {

gnmr::Communicator* g_world = nullptr;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}

  // The test's name is kept here because UnitTest::current_test_info() takes a lock that
  // GoogleTest already holds while it reports a part result.
  void OnTestStart(const ::testing::TestInfo& test) override {
    current_test_ = std::string(test.test_suite_name()) + "." + test.name();
  }

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, current_test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
  std::string current_test_ = "(outside a test)";
};

}  // namespace

gnmr::Communicator& world() {
  return *g_world;
}

}  // namespace gnmr_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<gnmr::Communicator> world;
  try {
    world = gnmr::make_communicator({"auto"});
  } catch (const gnmr::Error& e) {
    std::fprintf(stderr, "test_parallel: %s\n", e.what());
    return e.exit_code();
  }
  gnmr_test::g_world = world.get();

  if (world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new gnmr_test::FailurePrinter(world->rank()));
  }
  double failed_ranks = RUN_ALL_TESTS() != 0 ? 1.0 : 0.0;
  world->allreduce_sum(&failed_ranks, 1);
  if (world->rank() == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "test_parallel: %.0f of %d ranks had failures\n", failed_ranks,
                 world->world_size());
  }
  return failed_ranks > 0 ? 1 : 0;
}
