// The one-process communicator and make_communicator's choice of communicator. These tests
// make no MPI calls, so they run the same in the 1-process and the 2-rank ctest entries.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend_tensors.h"
#include "parallel/launch_env.h"
#include "parallel/local_communicator.h"
#include "util/error.h"

namespace gnmr {
namespace {

using testing::host_tensor;

LaunchEnv launched_by_slurm(int rank, int world_size) {
  LaunchEnv env;
  env.source = "slurm";
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.world_size_variable = "SLURM_NTASKS";
  return env;
}

ErrorKind kind_of_error(const std::string& kind, const LaunchEnv& env,
                        const std::string& backend = "cpu") {
  CommunicatorOptions options;
  options.kind = kind;
  options.backend = backend;
  try {
    make_communicator(options, env);
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "make_communicator(\"" << kind << "\") did not throw";
  return ErrorKind::Runtime;
}

TEST(LocalCommunicator, ShardCollectivesLeaveTheOneShardAsItIs) {
  LocalCommunicator comm;
  std::vector<float> values = {1.5f, -2.0f, 3.25f};
  Tensor t = host_tensor(values);
  comm.reduce_scatter_sum(t);
  comm.all_gather(t);
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  t.dtype = DType::BF16;
  EXPECT_THROW(comm.reduce_scatter_sum(t), Error);
  EXPECT_THROW(comm.all_gather(t), Error);
}

TEST(LocalCommunicator, IsAWorldOfOne) {
  LocalCommunicator comm;
  EXPECT_EQ(comm.name(), "local");
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.local_rank(), 0);
}

TEST(LocalCommunicator, CollectivesLeaveTheDataAsItIs) {
  LocalCommunicator comm;
  std::vector<float> values = {1.5f, -2.0f, 3.25f};
  Tensor t = host_tensor(values);
  comm.allreduce_sum(t);
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  comm.start_allreduce_sum(tensor_view(t, {2}, 1));
  comm.progress();
  comm.wait_all();
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f, 3.25f}));

  double sums[2] = {0.125, 7.0};
  comm.allreduce_sum(sums, 2);
  EXPECT_EQ(sums[0], 0.125);
  EXPECT_EQ(sums[1], 7.0);

  char bytes[] = "checkpoint";
  comm.broadcast(bytes, sizeof(bytes), 0);
  EXPECT_STREQ(bytes, "checkpoint");

  comm.barrier();
  EXPECT_TRUE(comm.all_agree(0x1234));
}

TEST(LocalCommunicator, RejectsWhatOtherCommunicatorsReject) {
  LocalCommunicator comm;
  std::vector<float> storage(4);
  Tensor t = host_tensor(storage);
  t.dtype = DType::BF16;
  EXPECT_THROW(comm.allreduce_sum(t), Error);
  char byte = 0;
  EXPECT_THROW(comm.broadcast(&byte, 1, 1), Error);
}

TEST(MakeCommunicator, AutoIsLocalForAOneProcessLaunch) {
  EXPECT_EQ(make_communicator({"auto"}, LaunchEnv{})->name(), "local");
  EXPECT_EQ(make_communicator({"local"}, LaunchEnv{})->name(), "local");
  EXPECT_EQ(make_communicator({"auto"}, launched_by_slurm(0, 1))->name(), "local");
  CommunicatorOptions on_gpu;
  on_gpu.backend = "cuda";
  EXPECT_EQ(make_communicator(on_gpu, LaunchEnv{})->name(), "local");
}

TEST(MakeCommunicator, RefusesLocalWhenTheLauncherStartedSeveralProcesses) {
  EXPECT_EQ(kind_of_error("local", launched_by_slurm(1, 4)), ErrorKind::Usage);
}

// Each communicator reads one kind of memory: nccl the GPU's, mpi the host's.
TEST(MakeCommunicator, RefusesACommunicatorThatCannotReadTheBackendsMemory) {
  EXPECT_EQ(kind_of_error("nccl", LaunchEnv{}, "cpu"), ErrorKind::Usage);
  EXPECT_EQ(kind_of_error("nccl", launched_by_slurm(0, 2), "cpu"), ErrorKind::Usage);
  EXPECT_EQ(kind_of_error("mpi", launched_by_slurm(0, 2), "cuda"), ErrorKind::Usage);
}

// srun without MASTER_ADDR and without a node list: nothing says where rank 0 listens.
TEST(MakeCommunicator, NcclWithoutARendezvousAddressIsAUsageErrorWhereNcclIsBuilt) {
#ifdef GNMR_WITH_NCCL
  const ErrorKind expected = ErrorKind::Usage;
#else
  const ErrorKind expected = ErrorKind::NotBuilt;
#endif
  EXPECT_EQ(kind_of_error("nccl", launched_by_slurm(1, 2), "cuda"), expected);
  EXPECT_EQ(kind_of_error("auto", launched_by_slurm(1, 2), "cuda"), expected);
}

TEST(MakeCommunicator, UnknownKindIsAUsageError) {
  EXPECT_EQ(kind_of_error("gloo", LaunchEnv{}), ErrorKind::Usage);
}

}  // namespace
}  // namespace gnmr
