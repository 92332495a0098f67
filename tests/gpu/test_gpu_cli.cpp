// `gnmr train --backend cuda` end to end through the command line: a run stopped at a
// checkpoint and resumed ends with the same bytes as an uninterrupted one (GPU resume is
// bit-exact), and a run with CUDA_LAUNCH_BLOCKING=1 (every kernel waits for the previous one)
// equals a normal one, so nothing depends on the host racing the device. fp8mix on the
// tiny-gpu model: real FP8 GEMMs on sm_90. Skip without a GPU.
//
// 4 steps, a checkpoint and an evaluation of 256 tokens every 2: the resumed run restarts
// after an evaluation, with the LR warmup done. (Each step is seconds on the CUDA emulation
// under ASan, where CI runs these tests: the fixture's 12 steps and 1024 evaluation tokens made
// them 10 minutes of CI's test time.)
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_fixture.h"
#include "gpu_test_util.h"

namespace {

using gnmr_test::run_gnmr;

std::string gpu_config(const std::string& dir) {
  return gnmr_test::write_tiny_config(
      dir, R"({"include": ")" + gnmr_test::source_path("configs/models/tiny-gpu.json") +
               R"(", "backend": "cuda", "precision": {"recipe": "fp8mix"},
                  "gnmr": {"controller": "static_low"}, "train": {"steps": 4},
                  "checkpoint": {"every": 2}, "eval": {"every": 2, "tokens": 256}})");
}

std::string train_args(const std::string& config, const std::string& out) {
  return "train --config " + config + " --out " + out;
}

TEST(GpuCli, ResumedRunEndsWithTheBytesOfAnUninterruptedOne) {
  SKIP_WITHOUT_GPU();
  const std::string dir = gnmr_test::scratch_dir("gpu_cli_resume");
  const std::string config = gpu_config(dir);
  auto whole = run_gnmr(train_args(config, dir + "/whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto first = run_gnmr(train_args(config, dir + "/split") + " --stop-at 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run_gnmr(train_args(config, dir + "/split") + " --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  gnmr_test::expect_same_checkpoint_files(dir + "/whole/checkpoints/step_00000004",
                                          dir + "/split/checkpoints/step_00000004");
}

TEST(GpuCli, BlockingLaunchesGiveTheSameBytes) {
  SKIP_WITHOUT_GPU();
  const std::string dir = gnmr_test::scratch_dir("gpu_cli_blocking");
  const std::string config = gpu_config(dir);
  auto normal = run_gnmr(train_args(config, dir + "/normal"));
  ASSERT_EQ(normal.exit_code, 0) << normal.output;
  auto blocking = run_gnmr(train_args(config, dir + "/blocking"), "CUDA_LAUNCH_BLOCKING=1");
  ASSERT_EQ(blocking.exit_code, 0) << blocking.output;
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/normal/checkpoints/step_00000004/model.safetensors"),
            gnmr_test::read_bytes(dir + "/blocking/checkpoints/step_00000004/model.safetensors"));
}

// `gnmr eval --backend cuda` gives the perplexity `--backend cpu` gives, of a checkpoint the CPU
// trained: both in fp32 (cuBLASLt's fp32 GEMMs and the fp32 flash attention on the GPU), so the
// mean losses differ by the rounding of sums taken in other orders, within the fp32 recipe's
// first-step tolerance of the GPU training tests (test_gpu_training.cpp).
TEST(GpuCli, EvalOnTheGpuGivesTheCpusPerplexity) {
  SKIP_WITHOUT_GPU();
  const std::string dir = gnmr_test::scratch_dir("gpu_cli_eval");
  const std::string config = gnmr_test::write_tiny_config(
      dir, R"({"include": ")" + gnmr_test::source_path("configs/models/tiny-gpu.json") +
               R"(", "train": {"steps": 2}, "eval": {"every": 0}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run")).exit_code, 0);
  const std::string eval = "eval --checkpoint " + dir + "/run/checkpoints/step_00000002 --data '" +
                           gnmr_test::brown_shards_dir() + "/val_*.bin' --tokens 512 --json";
  auto cpu = run_gnmr(eval + " --backend cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  auto gpu = run_gnmr(eval + " --backend cuda");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  EXPECT_NE(gpu.output.find("/step_00000002 on cuda ("), std::string::npos) << gpu.output;
  EXPECT_NE(cpu.output.find("/step_00000002 on cpu ("), std::string::npos) << cpu.output;
  const nlohmann::json on_cpu = gnmr_test::last_json_line(cpu.output),
                       on_gpu = gnmr_test::last_json_line(gpu.output);
  EXPECT_EQ(on_gpu["tokens"], on_cpu["tokens"]);
  const double loss = on_cpu["loss"];
  EXPECT_NEAR(double(on_gpu["loss"]), loss, 1e-5 * loss) << gpu.output;
}

}  // namespace
