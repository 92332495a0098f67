// Data parallelism on GPU ranks through the command line (docs/DESIGN.md §7): the nccl
// communicator's overlapped gradient reduction and ZeRO-1. With one GPU, ZeRO-1 over a one-rank
// nccl communicator trains the plain run's bits. With two GPUs (skipped otherwise; NCCL does
// not take two ranks on one device), two processes launched as torchrun launches them (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; the TCP rendezvous hands out the NCCL id): each
// element of a two-rank sum is one addition, x_0 + x_1, whatever NCCL's algorithm, so the
// bucketed reduction overlapped with backward must train the unbucketed bits, ZeRO-1 the plain
// data-parallel bits, and a ZeRO-1 run resumed from its sharded checkpoint the uninterrupted
// bits. Launched by mpirun instead (the NCCL id handed out over MPI; builds with MPI), the ranks
// train the torchrun launch's bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "cli/cli_fixture.h"
#include "gpu_test_util.h"

namespace {

using gnmr_test::gpu_count;
using gnmr_test::run_gnmr;

// 4 steps of the tiny GPU model, 256 tokens a step: one micro-step of 4 × 32 per rank on two
// ranks. Buckets of 0.05 MiB (13107 floats) cut each layer into several, some across the
// ZeRO-1 shard edge. Thresholds of 0.5 over a window of one step, with no controller warmup,
// make the gnmr controller route units in step 4 (the early norms fall, so GNMR stays below
// 1), so routing is compared too, after a resume from step 2 as well. The final evaluation
// reads 256 tokens, a micro-batch per rank. (Each step is seconds on the CUDA emulation under
// ASan, where CI runs these tests: 6 steps and the fixture's 1024 evaluation tokens made this
// file's tests 13 minutes of CI's test time.)
std::string data_parallel_config(const std::string& dir) {
  return gnmr_test::write_tiny_config(
      dir, R"({"include": ")" + gnmr_test::source_path("configs/models/tiny-gpu.json") +
               R"(", "backend": "cuda", "precision": {"recipe": "fp8mix"},
                  "train": {"steps": 4},
                  "dist": {"bucket_mb": 0.05, "timeout_s": 120},
                  "gnmr": {"controller": "gnmr", "max_active": 0.25, "alpha": 0.5,
                           "beta": 0.5, "window": 1,
                           "lock_steps": 1, "warmup_steps": 0, "history_start": 1},
                  "eval": {"every": 0, "tokens": 256}, "checkpoint": {"every": 2, "keep": 5},
                  "log": {"every": 1}})");
}

// `gnmr ARGS` on `ranks` processes of this node, one GPU each (gnmr_test::run_ranks).
gnmr_test::RanksResult run_ranks(int ranks, const std::string& args, const std::string& log) {
  return gnmr_test::run_ranks(gnmr_test::gnmr_binary(), ranks, args, log);
}

std::string train_args(const std::string& config, const std::string& out, int zero,
                       double bucket_mb) {
  return "train --config " + config + " --out " + out + " --set dist.zero=" + std::to_string(zero) +
         " --set dist.bucket_mb=" + std::to_string(bucket_mb);
}

// Each step's loss, norm and routing (what the controller saw and decided); memory and timing
// fields differ between the ways of running by design.
std::vector<nlohmann::json> train_lines(const std::string& run_dir) {
  std::vector<nlohmann::json> lines;
  for (const auto& l : gnmr_test::read_metrics(run_dir + "/metrics.jsonl")) {
    if (l["kind"] != "train") continue;
    nlohmann::json kept;
    for (const char* key :
         {"step", "loss", "grad_norm", "skipped", "units_recovery", "active_units",
          "candidate_units", "gnmr_exceedances", "delta_exceedances", "switches"}) {
      kept[key] = l.at(key);
    }
    lines.push_back(kept);
  }
  return lines;
}

const char* const kLastStep = "/checkpoints/step_00000004/";

TEST(GpuDataParallel, ZeroOneOverOneNcclRankTrainsThePlainBits) {
  SKIP_WITHOUT_GPU();
  const std::string dir = gnmr_test::scratch_dir("gpu_zero_one_rank");
  const std::string config = data_parallel_config(dir);
  auto plain = run_gnmr(train_args(config, dir + "/plain", 0, 0));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto zero = run_gnmr(train_args(config, dir + "/zero", 1, 0) + " --set dist.communicator=nccl");
  if (zero.output.find("NCCL could not be loaded") != std::string::npos) {
    GTEST_SKIP() << zero.output;
  }
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(train_lines(dir + "/zero"), train_lines(dir + "/plain"));
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/zero" + kLastStep + "model.safetensors"),
            gnmr_test::read_bytes(dir + "/plain" + kLastStep + "model.safetensors"));
}

TEST(GpuDataParallel, TwoGpusBucketedAndZeroOneTrainThePlainBitsAndResumeExactly) {
  SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (" << gpu_count() << " visible)";
  const std::string dir = gnmr_test::scratch_dir("gpu_two_ranks");
  const std::string config = data_parallel_config(dir);
  struct Run {
    const char* name;
    int zero;
    double bucket_mb;
  };
  const Run runs[] = {
      {"plain", 0, 0}, {"bucketed", 0, 0.05}, {"zero", 1, 0}, {"zero_bucketed", 1, 0.05}};
  for (const Run& run : runs) {
    auto r = run_ranks(2, train_args(config, dir + "/" + run.name, run.zero, run.bucket_mb),
                       dir + "/" + run.name + ".log");
    ASSERT_TRUE(r.all_succeeded()) << run.name << ":\n" << r.output;
  }
  const auto plain = train_lines(dir + "/plain");
  ASSERT_EQ(plain.size(), 4u);
  int routed = 0;
  for (const auto& line : plain) routed += line["units_recovery"].get<int>();
  EXPECT_GT(routed, 0) << "the controller never routed a unit: the routing check is vacuous";
  EXPECT_EQ(train_lines(dir + "/bucketed"), plain) << "bucketed plain data parallel";
  const std::string plain_weights =
      gnmr_test::read_bytes(dir + "/plain" + kLastStep + "model.safetensors");
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/bucketed" + kLastStep + "model.safetensors"),
            plain_weights);
  for (const char* zero_run : {"zero", "zero_bucketed"}) {
    SCOPED_TRACE(zero_run);
    const auto lines = train_lines(dir + "/" + zero_run);
    ASSERT_EQ(lines.size(), plain.size());
    for (size_t s = 0; s < lines.size(); ++s) {
      // The squared norm of a parameter cut by the shard edge is two partial doubles added
      // (zero_optimizer.h): ~1e-16 relative; everything else is the plain run's.
      EXPECT_EQ(lines[s]["loss"], plain[s]["loss"]) << "step " << s + 1;
      EXPECT_EQ(lines[s]["units_recovery"], plain[s]["units_recovery"]) << "step " << s + 1;
      EXPECT_NEAR(lines[s]["grad_norm"].get<double>(), plain[s]["grad_norm"].get<double>(),
                  1e-12 * plain[s]["grad_norm"].get<double>());
    }
    EXPECT_EQ(gnmr_test::read_bytes(dir + "/" + zero_run + kLastStep + "model.safetensors"),
              plain_weights);
  }
  // ZeRO-1 (bucketed) stopped at step 2 and resumed from its sharded checkpoint.
  const std::string split = dir + "/zero_split";
  auto first = run_ranks(2, train_args(config, split, 1, 0.05) + " --stop-at 2", split + ".log");
  ASSERT_TRUE(first.all_succeeded()) << first.output;
  auto second =
      run_ranks(2, train_args(config, split, 1, 0.05) + " --resume auto", split + ".log2");
  ASSERT_TRUE(second.all_succeeded()) << second.output;
  for (const char* file : {"model.safetensors", "optimizer.shard_0_of_2.safetensors",
                           "optimizer.shard_1_of_2.safetensors"}) {
    EXPECT_EQ(gnmr_test::read_bytes(split + kLastStep + file),
              gnmr_test::read_bytes(dir + "/zero_bucketed" + kLastStep + file))
        << file << " differs after resume";
  }
}

// An MPI launcher (mpirun, or srun with an MPI plugin) sets none of torchrun's variables: the
// ranks find each other through MPI, which hands out rank 0's NCCL id, and each picks its GPU
// from MPI's local rank. The job is the torchrun launch's, so it must train the same bits. Not
// in a build without MPI (the GPU bundle, where a skipped test would fail gpu_check.sh).
#ifdef GNMR_MPIEXEC
TEST(GpuDataParallel, TwoGpusLaunchedByMpirunTrainTheTorchrunBits) {
  SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (" << gpu_count() << " visible)";
  const std::string dir = gnmr_test::scratch_dir("gpu_two_ranks_mpirun");
  const std::string config = data_parallel_config(dir);
  auto torchrun =
      run_ranks(2, train_args(config, dir + "/torchrun", 0, 0.05), dir + "/torchrun.log");
  ASSERT_TRUE(torchrun.all_succeeded()) << torchrun.output;
  auto mpirun = gnmr_test::run_gnmr_mpi(
      GNMR_MPIEXEC, 2, train_args(config, dir + "/mpirun", 0, 0.05), "timeout 300");
  ASSERT_EQ(mpirun.exit_code, 0) << mpirun.output;
  EXPECT_NE(mpirun.output.find("gradient sum over 2 ranks"), std::string::npos) << mpirun.output;
  EXPECT_EQ(train_lines(dir + "/mpirun"), train_lines(dir + "/torchrun"));
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/mpirun" + kLastStep + "model.safetensors"),
            gnmr_test::read_bytes(dir + "/torchrun" + kLastStep + "model.safetensors"));
}

// Under mpirun, a rank that cannot create its NCCL communicator (here: NCCL_COMM_BLOCKING=1 in
// its environment only, which gnmr refuses) ends the job at once through MPI, with its error;
// the other rank used to wait in its own creation until dist.timeout_s (90 s here, past the
// 60 s `timeout` that bounds the test: exit 124).
TEST(GpuDataParallel, TwoGpusUnderMpirunEndAtOnceWhenOneCannotCreateItsCommunicator) {
  SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (" << gpu_count() << " visible)";
  const std::string dir = gnmr_test::scratch_dir("gpu_two_ranks_mpirun_creation_failure");
  const std::string args =
      train_args(data_parallel_config(dir), dir + "/run", 0, 0.05) + " --set dist.timeout_s=90";
  auto r = gnmr_test::run_gnmr_mpi(
      GNMR_MPIEXEC, 1,
      args + " : -np 1 -x NCCL_COMM_BLOCKING=1 '" + gnmr_test::gnmr_binary() + "' " + args,
      "timeout 60");
  EXPECT_NE(r.exit_code, 124) << "rank 0 waited out its deadline:\n" << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;  // ErrorKind::Runtime, rank 1's
  EXPECT_NE(r.output.find("rank 1: NCCL_COMM_BLOCKING=1 would make NCCL's calls block"),
            std::string::npos)
      << r.output;
}
#endif

}  // namespace
