// parse_launch_env: each launcher's variables, their precedence, and bad launches.
#include <gtest/gtest.h>

#include "parallel/launch_env.h"
#include "tests/parallel/env_map.h"
#include "util/error.h"

namespace gnmr {
namespace {

using gnmr_test::env_map;

// Expects parse_launch_env to throw a Usage error whose message contains `needle`.
void expect_usage_error(std::map<std::string, std::string> variables, const std::string& needle) {
  try {
    parse_launch_env(env_map(std::move(variables)));
    ADD_FAILURE() << "expected a Usage error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, NoLauncherVariablesMeansOneProcess) {
  LaunchEnv env = parse_launch_env(env_map({{"HOME", "/root"}}));
  EXPECT_EQ(env.source, "single");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
}

TEST(LaunchEnv, ReadsOpenMpiVariables) {
  LaunchEnv env = parse_launch_env(env_map({{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(env.source, "mpi");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size_variable, "OMPI_COMM_WORLD_SIZE");
}

TEST(LaunchEnv, ReadsPmiVariablesWithEitherLocalRankName) {
  LaunchEnv env =
      parse_launch_env(env_map({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "3"}}));
  EXPECT_EQ(env.source, "mpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 3);
  env = parse_launch_env(env_map({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"PMI_LOCAL_RANK", "0"}}));
  EXPECT_EQ(env.local_rank, 0);
}

TEST(LaunchEnv, MissingLocalRankIsMinusOne) {
  LaunchEnv env = parse_launch_env(env_map({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  EXPECT_EQ(env.local_rank, -1);
}

// srun --mpi=pmi2 may export no PMI local rank: srun's SLURM_LOCALID is this process's when
// SLURM_PROCID is its rank, never when it was inherited (mpirun inside a batch script).
TEST(LaunchEnv, PmiWithoutALocalRankTakesSrunsLocalIdOnlyForTheSameProcess) {
  LaunchEnv env = parse_launch_env(env_map({{"PMI_RANK", "5"},
                                            {"PMI_SIZE", "8"},
                                            {"SLURM_PROCID", "5"},
                                            {"SLURM_NTASKS", "8"},
                                            {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(env.source, "mpi");
  EXPECT_EQ(env.local_rank, 1);
  env = parse_launch_env(env_map({{"PMI_RANK", "5"},
                                  {"PMI_SIZE", "8"},
                                  {"SLURM_PROCID", "0"},
                                  {"SLURM_NTASKS", "1"},
                                  {"SLURM_LOCALID", "0"}}));
  EXPECT_EQ(env.local_rank, -1);
  // A PMI local rank, when there is one, wins.
  env = parse_launch_env(env_map({{"PMI_RANK", "5"},
                                  {"PMI_SIZE", "8"},
                                  {"PMI_LOCAL_RANK", "2"},
                                  {"SLURM_PROCID", "5"},
                                  {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(env.local_rank, 2);
}

// The cuda backend's GPU: the local rank's among several visible, the only one when the launcher
// gave each task its own (srun --gpus-per-task=1 leaves one visible to local rank 3), and a
// problem in words when neither works.
TEST(GpuForProcess, TakesTheLocalRanksGpuOrTheOnlyVisibleOne) {
  LaunchEnv env;
  env.world_size = 16;
  env.rank = 11;
  env.local_rank = 3;
  EXPECT_EQ(gpu_for_process(env, 8).device, 3);
  EXPECT_EQ(gpu_for_process(env, 1).device, 0);
  EXPECT_EQ(gpu_for_process(env, 0).device, 0);  // the device probe reports "no device"
  const GpuChoice too_few = gpu_for_process(env, 2);
  EXPECT_EQ(too_few.device, -1);
  EXPECT_NE(too_few.problem.find("local rank 3 but only 2 GPUs"), std::string::npos)
      << too_few.problem;
  env.local_rank = -1;
  const GpuChoice unknown = gpu_for_process(env, 8);
  EXPECT_EQ(unknown.device, -1);
  EXPECT_NE(unknown.problem.find("rank 11"), std::string::npos) << unknown.problem;
  EXPECT_EQ(gpu_for_process(env, 1).device, 0);
  env.world_size = 1;
  env.rank = 0;
  EXPECT_EQ(gpu_for_process(env, 8).device, 0);  // one process, no launcher: the first GPU
  EXPECT_TRUE(gpu_for_process(env, 8).problem.empty());
}

TEST(LaunchEnv, ReadsTheRanksOnThisNodeFromEachLauncher) {
  EXPECT_EQ(parse_launch_env(env_map({{"HOME", "/root"}})).local_size, 1);
  EXPECT_EQ(parse_launch_env(env_map({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "8"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}))
                .local_size,
            4);
  EXPECT_EQ(
      parse_launch_env(env_map({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALNRANKS", "2"}}))
          .local_size,
      2);
  EXPECT_EQ(
      parse_launch_env(env_map({{"RANK", "0"}, {"WORLD_SIZE", "16"}, {"LOCAL_WORLD_SIZE", "8"}}))
          .local_size,
      8);
  EXPECT_EQ(
      parse_launch_env(
          env_map({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}}))
          .local_size,
      2);
  // A launcher that does not say.
  EXPECT_EQ(parse_launch_env(env_map({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}})).local_size,
            -1);
}

TEST(LaunchEnv, ALocalSizeOutsideOneToTheWorldSizeIsAUsageError) {
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "0"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}},
                     "OMPI_COMM_WORLD_LOCAL_SIZE=3 is not between 1 and OMPI_COMM_WORLD_SIZE=2");
  expect_usage_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "0"}},
                     "LOCAL_WORLD_SIZE=0");
}

TEST(LaunchEnv, ReadsSlurmVariables) {
  LaunchEnv env = parse_launch_env(
      env_map({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"}}));
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 16);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.world_size_variable, "SLURM_NTASKS");
  // srun --mpi=none: no wire-up, and the hint for an MPI_Init that then fails.
  EXPECT_FALSE(env.mpi_wireup);
  EXPECT_NE(srun_without_mpi_plugin_hint(env).find("srun --mpi=pmix"), std::string::npos);
  // srun --mpi=pmix: PMIx's rank; no hint.
  const LaunchEnv pmix = parse_launch_env(
      env_map({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}, {"PMIX_RANK", "6"}}));
  EXPECT_TRUE(pmix.mpi_wireup);
  EXPECT_EQ(srun_without_mpi_plugin_hint(pmix), "");
}

// Inside an allocation of 16 tasks an `srun -n 4` step has SLURM_NTASKS of the allocation
// on some SLURM versions; the step's own count is the world.
TEST(LaunchEnv, SlurmStepTaskCountWinsOverJobTaskCount) {
  LaunchEnv env = parse_launch_env(env_map({{"SLURM_PROCID", "3"},
                                            {"SLURM_NTASKS", "16"},
                                            {"SLURM_STEP_NUM_TASKS", "4"},
                                            {"SLURM_LOCALID", "3"}}));
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.world_size_variable, "SLURM_STEP_NUM_TASKS");
}

// mpirun inside a SLURM allocation: the SLURM variables describe the allocation (every
// process may see SLURM_PROCID=0), the MPI ones describe this process.
TEST(LaunchEnv, MpiVariablesWinOverSlurmVariables) {
  LaunchEnv env = parse_launch_env(env_map({{"SLURM_PROCID", "0"},
                                            {"SLURM_NTASKS", "1"},
                                            {"SLURM_LOCALID", "0"},
                                            {"OMPI_COMM_WORLD_RANK", "1"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(env.source, "mpi");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
}

TEST(LaunchEnv, RankNotBelowWorldSizeIsAUsageErrorNamingBothVariables) {
  expect_usage_error({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}},
                     "SLURM_PROCID=4 is not below SLURM_NTASKS=4");
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                     "OMPI_COMM_WORLD_RANK=9");
}

TEST(LaunchEnv, LocalRankNotBelowWorldSizeIsAUsageError) {
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "2"}},
                     "SLURM_LOCALID=2");
}

TEST(LaunchEnv, NonNumbersAreUsageErrorsNamingTheVariable) {
  for (const char* bad : {"abc", "1x", "-1", "", " 1", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    expect_usage_error({{"SLURM_PROCID", bad}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}},
                       "SLURM_PROCID=\"" + std::string(bad) + "\" is not a non-negative integer");
  }
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "two"}},
                     "OMPI_COMM_WORLD_SIZE=\"two\"");
  expect_usage_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0.5"}},
                     "MPI_LOCALRANKID=\"0.5\"");
}

TEST(LaunchEnv, RankWithoutWorldSizeIsAUsageError) {
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE is not");
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}, "SLURM_STEP_NUM_TASKS");
}

TEST(LaunchEnv, WorldSizeZeroIsAUsageError) {
  expect_usage_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, "PMI_SIZE=0");
}

TEST(LaunchEnv, ReadsTorchrunVariablesAndItsRendezvousAddress) {
  LaunchEnv env = parse_launch_env(env_map({{"RANK", "3"},
                                            {"WORLD_SIZE", "4"},
                                            {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "10.0.0.7"},
                                            {"MASTER_PORT", "29411"},
                                            {"TORCHELASTIC_RUN_ID", "run-42"}}));
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.rendezvous_host, "10.0.0.7");
  // torchrun's agent holds MASTER_PORT (its store), so gnmr's rank 0 listens one above.
  EXPECT_EQ(env.rendezvous_port, 29412);
  EXPECT_EQ(env.job_id, "run-42");
  // The same variables set by hand (no agent): MASTER_PORT itself.
  env = parse_launch_env(env_map(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29411"}}));
  EXPECT_EQ(env.rendezvous_port, 29411);
  // GNMR_RENDEZVOUS_PORT wins over both.
  env = parse_launch_env(env_map({{"RANK", "3"},
                                  {"WORLD_SIZE", "4"},
                                  {"MASTER_PORT", "29411"},
                                  {"TORCHELASTIC_RUN_ID", "run-42"},
                                  {"GNMR_RENDEZVOUS_PORT", "31000"}}));
  EXPECT_EQ(env.rendezvous_port, 31000);
  expect_usage_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65535"}, {"TORCHELASTIC_RUN_ID", "r"}},
      "GNMR_RENDEZVOUS_PORT");
}

// torchrun started by srun: the tasks see both, and torchrun's numbering is this process's.
TEST(LaunchEnv, TorchrunInsideASlurmStepWins) {
  LaunchEnv env = parse_launch_env(env_map({{"RANK", "9"},
                                            {"WORLD_SIZE", "16"},
                                            {"SLURM_PROCID", "1"},
                                            {"SLURM_NTASKS", "2"},
                                            {"SLURM_JOB_ID", "777"}}));
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 9);
  EXPECT_EQ(env.world_size, 16);
  EXPECT_EQ(env.job_id, "777");
}

TEST(LaunchEnv, SlurmRendezvousIsTheStepsFirstNodeOnAPortFromTheJobId) {
  LaunchEnv env = parse_launch_env(env_map({{"SLURM_PROCID", "0"},
                                            {"SLURM_NTASKS", "16"},
                                            {"SLURM_JOB_ID", "4000012345"},
                                            {"SLURM_JOB_NODELIST", "login[1-2]"},
                                            {"SLURM_STEP_NODELIST", "gpu[003-004],gpu017"}}));
  EXPECT_EQ(env.rendezvous_host, "gpu003");
  EXPECT_EQ(env.rendezvous_port, 29500 + 345);  // a job id above INT_MAX is still read
  EXPECT_EQ(env.job_id, "4000012345");
}

// The file rendezvous names its files after the attempt: a requeued job (same SLURM_JOB_ID)
// and a second srun step must not read the first one's files.
TEST(LaunchEnv, TheAttemptCountsRequeuesAndStepsOfOneJob) {
  EXPECT_EQ(parse_launch_env(env_map({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})).attempt,
            "restart0");
  EXPECT_EQ(parse_launch_env(env_map({{"SLURM_PROCID", "1"},
                                      {"SLURM_NTASKS", "2"},
                                      {"SLURM_JOB_ID", "77"},
                                      {"SLURM_RESTART_COUNT", "2"},
                                      {"SLURM_STEP_ID", "5"}}))
                .attempt,
            "restart2.step5");
  EXPECT_EQ(parse_launch_env(env_map({{"RANK", "0"},
                                      {"WORLD_SIZE", "2"},
                                      {"TORCHELASTIC_RUN_ID", "r"},
                                      {"TORCHELASTIC_RESTART_COUNT", "3"}}))
                .attempt,
            "restart3");
  expect_usage_error(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_RESTART_COUNT", "once"}},
      "SLURM_RESTART_COUNT");
}

TEST(LaunchEnv, ABadMasterPortIsRefusedByName) {
  expect_usage_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
                     "MASTER_PORT=70000");
  expect_usage_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}, "MASTER_PORT");
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "12x"}},
                     "SLURM_JOB_ID");
}

TEST(FirstSlurmHost, TakesTheFirstHostOfEveryListShape) {
  EXPECT_EQ(first_slurm_host("node5"), "node5");
  EXPECT_EQ(first_slurm_host("node5,node6"), "node5");
  EXPECT_EQ(first_slurm_host("gpu[003-010,017],login1"), "gpu003");
  EXPECT_EQ(first_slurm_host("gpu[17,3-5]"), "gpu17");  // SLURM's order, not the smallest
  EXPECT_EQ(first_slurm_host("rack[1-2]-n[07-08]"), "rack1-n07");
  EXPECT_EQ(first_slurm_host("a-[9]-b"), "a-9-b");
}

TEST(FirstSlurmHost, RefusesAMalformedList) {
  for (const std::string list : {"gpu[003-010", "gpu[]", "", ",node1"}) {
    try {
      first_slurm_host(list);
      ADD_FAILURE() << "accepted " << list;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("node list"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gnmr
