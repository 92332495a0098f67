// `gnmr train`, `eval`, `export` end to end on the bundled corpus: the run directory
// contract, bit-exact resume, non-finite steps, HF round trip, and learning itself.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli_fixture.h"
#include "data/shard.h"
#include "train/checkpoint_manifest.h"
#include "util/fnv1a.h"

namespace fs = std::filesystem;
using gnmr_test::run_gnmr;

namespace {

std::string train_args(const std::string& config, const std::string& out) {
  return "train --config " + config + " --out " + out;
}

double eval_loss(const std::string& args) {
  auto r = run_gnmr("eval " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto brace = r.output.rfind('{');
  if (brace == std::string::npos) return NAN;
  return nlohmann::json::parse(r.output.substr(brace))["loss"].get<double>();
}

// Runs `gnmr ARGS`, expecting exit code CODE and TEXT in its output; returns the output.
std::string expect_gnmr(const std::string& args, int code, const std::string& text) {
  auto r = run_gnmr(args);
  EXPECT_EQ(r.exit_code, code) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(text), std::string::npos) << args << "\n" << r.output;
  return r.output;
}

// A 2-step run of the tiny model in the scratch directory NAME (its run in NAME/run), with
// its one checkpoint, for a test that edits the checkpoint and resumes.
struct TwoStepRun {
  std::string dir, config, checkpoint;
};
TwoStepRun two_step_run(const std::string& name) {
  TwoStepRun r;
  r.dir = gnmr_test::scratch_dir(name);
  r.config =
      gnmr_test::write_tiny_config(r.dir, R"({"train": {"steps": 2}, "eval": {"every": 0}})");
  auto trained = run_gnmr(train_args(r.config, r.dir + "/run"));
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  r.checkpoint = r.dir + "/run/checkpoints/step_00000002";
  return r;
}

}  // namespace

// For each data order: random draws hash the step, shuffled numbers the run's rows globally.
TEST(CliTrain, ResumeAfterAStopIsBitExact) {
  for (const std::string sampling : {"random", "shuffled"}) {
    SCOPED_TRACE(sampling);
    std::string dir = gnmr_test::scratch_dir("cli_resume_" + sampling);
    std::string config = gnmr_test::write_tiny_config(dir);
    const std::string order = " --set data.sampling=" + sampling;
    auto whole = run_gnmr(train_args(config, dir + "/whole") + order);
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    // The start-up line says how much of the data the run reads.
    EXPECT_NE(whole.output.find("epoch(s), data.sampling = " + sampling), std::string::npos)
        << whole.output;
    auto first = run_gnmr(train_args(config, dir + "/split") + order + " --stop-at 6");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    ASSERT_TRUE(fs::exists(dir + "/split/checkpoints/step_00000006"));
    ASSERT_FALSE(fs::exists(dir + "/split/checkpoints/step_00000012"));
    auto second = run_gnmr(train_args(config, dir + "/split") + order + " --resume auto");
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_EQ(second.output.find("bits may now differ"), std::string::npos) << second.output;

    gnmr_test::expect_same_checkpoint_files(dir + "/whole/checkpoints/step_00000012",
                                            dir + "/split/checkpoints/step_00000012");
    gnmr_test::expect_same_metrics(dir + "/whole", dir + "/split");
  }
}

// A resume with another GEMM thread count (or BLAS kernel: a requeue onto another CPU type)
// went on silently under other bits; trainer.json records them and the resume says so.
TEST(CliTrain, ResumeUnderAnotherThreadCountSaysItIsNoLongerBitExact) {
  std::string dir = gnmr_test::scratch_dir("cli_resume_threads");
  std::string config = gnmr_test::write_tiny_config(dir);
  auto first = run_gnmr(train_args(config, dir + "/run") + " --set train.threads=1 --stop-at 6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string trainer =
      gnmr_test::read_bytes(dir + "/run/checkpoints/step_00000006/trainer.json");
  EXPECT_NE(trainer.find("\"numerics\": \"cpu: OpenBLAS"), std::string::npos) << trainer;
  EXPECT_NE(trainer.find(", GEMM rows split over 1 thread(s)\""), std::string::npos) << trainer;
  auto second = run_gnmr(train_args(config, dir + "/run") + " --set train.threads=2 --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find(" over 1 thread(s); this job runs with cpu: OpenBLAS"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("over 2 thread(s): the run goes on correctly, but its bits may now "
                               "differ"),
            std::string::npos)
      << second.output;
}

// Shards replaced under the same glob (a new prepare into the same directory) once changed a
// resumed run's batches unsaid; trainer.json records the shards' names and sizes.
TEST(CliTrain, ResumeOnOtherShardsSaysTheBatchesDiffer) {
  std::string dir = gnmr_test::scratch_dir("cli_resume_other_shards");
  std::string config = gnmr_test::write_tiny_config(dir);
  auto first = run_gnmr(train_args(config, dir + "/run") + " --stop-at 6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string trainer =
      gnmr_test::read_bytes(dir + "/run/checkpoints/step_00000006/trainer.json");
  EXPECT_NE(trainer.find(" tokens, files "), std::string::npos) << trainer;
  // The same shards twice over, in a directory of their own.
  const std::string shards = gnmr_test::brown_shards_dir();
  fs::create_directories(dir + "/more");
  fs::copy_file(shards + "/train_000000.bin", dir + "/more/train_000000.bin");
  fs::copy_file(shards + "/train_000000.bin", dir + "/more/train_000001.bin");
  auto second = run_gnmr(train_args(config, dir + "/run") + " --set 'data.train=\"" + dir +
                         "/more/train_*.bin\"' --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("was trained on other data.train shards (1 shard(s)"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("than this job reads (2 shard(s)"), std::string::npos)
      << second.output;
}

// `--check` finds on a login node what the job would refuse before its first step, without a
// model or a backend, and changes nothing: the plan for a fresh run, a batch that N ranks
// cannot split (exit 3), a run directory that holds a run (exit 5), a resume it would take.
TEST(CliTrain, CheckReportsThePlanOrTheRefusalAndChangesNothing) {
  std::string dir = gnmr_test::scratch_dir("cli_train_check");
  std::string config = gnmr_test::write_tiny_config(dir);
  const std::string run = train_args(config, dir + "/run") + " --check";
  const std::string fresh = train_args(config, dir + "/fresh") + " --check";
  const std::string plan =
      expect_gnmr(run + " --world-size 2", 0, "the job would start (2 rank(s), backend cpu)");
  EXPECT_NE(plan.find("256 tokens a step = 1 micro-step(s) of 4 x 32 tokens on each of 2"),
            std::string::npos)
      << plan;
  EXPECT_FALSE(fs::exists(dir + "/run")) << "--check made the run directory";
  expect_gnmr(run + " --world-size 3", 3, "must be a multiple of train.micro_batch");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run") + " --stop-at 6").exit_code, 0);
  const std::string metrics = gnmr_test::read_bytes(dir + "/run/metrics.jsonl");
  expect_gnmr(run, 5, "already holds a run");
  expect_gnmr(run + " --resume auto", 0, "resumes from " + dir + "/run/checkpoints/step_00000006");
  // What the job would refuse only once it had a model: the checkpointed controller state under
  // other gnmr.* options, another model shape, the oracle on two ranks.
  expect_gnmr(run + " --resume auto --set gnmr.alpha=3", 5, "gnmr.alpha differs");
  expect_gnmr(run + " --resume auto --set model.dim=128", 5,
              "step_00000006 was trained with model.dim=64");
  expect_gnmr(fresh + " --world-size 2 --set gnmr.controller=oracle", 3, "run on one rank");
  // And what it would warn of: a controller that cannot select before the run ends; the oracle
  // under gnmr.oracle_same_step runs the plan of step 12 at step 12 itself.
  const std::string late = fresh + " --set precision.recipe=actq --set gnmr.warmup_steps=12";
  expect_gnmr(late, 0, "can first select a unit at step 12");
  const std::string same_step =
      expect_gnmr(late + " --set gnmr.controller=oracle --set gnmr.oracle_same_step=true", 0,
                  "the job would start");
  EXPECT_EQ(same_step.find("can first select"), std::string::npos) << same_step;
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/run/metrics.jsonl"), metrics);
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints/step_00000012"));
  EXPECT_FALSE(fs::exists(dir + "/fresh"));
}

TEST(CliTrain, ExistingRunIsNeverOverwrittenWithoutForce) {
  std::string dir = gnmr_test::scratch_dir("cli_overwrite");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}, "eval": {"every": 0}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run")).exit_code, 0);
  const std::string before = gnmr_test::read_bytes(dir + "/run/metrics.jsonl");
  auto again = run_gnmr(train_args(config, dir + "/run"));
  EXPECT_EQ(again.exit_code, 5) << again.output;
  EXPECT_NE(again.output.find("--resume auto"), std::string::npos) << again.output;
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/run/metrics.jsonl"), before);
  auto forced = run_gnmr(train_args(config, dir + "/run") + " --force");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
}

TEST(CliTrain, ResumeWithADifferentModelIsRefused) {
  std::string dir = gnmr_test::scratch_dir("cli_mismatch");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}, "eval": {"every": 0}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run")).exit_code, 0);
  expect_gnmr(train_args(config, dir + "/run") + " --resume auto --set model.ffn_dim=128", 5,
              "model.ffn_dim");
  // Another attention kernel is the same model: it goes on, and the log says what changed.
  expect_gnmr(train_args(config, dir + "/run") +
                  " --resume auto --steps 3 --set model.attention=materialized",
              0, "model.attention \"auto\" -> \"materialized\"");
}

// A model key added to the schema after a checkpoint was written: that gnmr did what the
// key's default says, so the run resumes under the default and is refused under another value.
TEST(CliTrain, ACheckpointFromBeforeAModelKeyResumesUnderTheKeysDefault) {
  const TwoStepRun run = two_step_run("cli_older_model_keys");
  const std::string &dir = run.dir, &config = run.config, &ckpt = run.checkpoint;
  auto saved = nlohmann::json::parse(gnmr_test::read_bytes(ckpt + "/config.json"));
  ASSERT_EQ(saved["model"]["rope_theta"], 10000.0);  // tiny.json leaves it at the default
  saved["model"].erase("rope_theta");
  std::ofstream(ckpt + "/config.json") << saved.dump(2);
  gnmr::write_checkpoint_manifest(ckpt);  // intact, as that gnmr wrote it

  expect_gnmr(train_args(config, dir + "/run") + " --resume auto --set model.rope_theta=5000", 5,
              "model.rope_theta=10000.0 (its config.json predates the key: the default), the "
              "config says 5000");
  expect_gnmr(train_args(config, dir + "/run") + " --resume auto --steps 3 --check", 0,
              "step_00000002");
  expect_gnmr(train_args(config, dir + "/run") + " --resume auto --steps 3", 0,
              "model.rope_theta (unset) -> 10000.0");
}

// A controller state of another format version (a newer gnmr's) is intact: the error says
// which version, not that the checkpoint is damaged.
TEST(CliTrain, AControllerStateOfAnotherFormatVersionIsNamedAsSuch) {
  const TwoStepRun run = two_step_run("cli_controller_version");
  const std::string &dir = run.dir, &config = run.config, &ckpt = run.checkpoint;
  std::string blob = gnmr_test::read_bytes(ckpt + "/controller.bin");
  ASSERT_GT(blob.size(), 20u);
  blob[8] = 2;  // the u32 version after the 8-byte magic; the FNV-1a checksum (last 8) redone
  blob.resize(blob.size() - 8);
  const uint64_t checksum = gnmr::fnv1a(blob.data(), blob.size());
  for (int i = 0; i < 8; ++i) blob.push_back(char(checksum >> (8 * i)));
  std::ofstream(ckpt + "/controller.bin", std::ios::binary | std::ios::trunc) << blob;
  gnmr::write_checkpoint_manifest(ckpt);
  const std::string output =
      expect_gnmr(train_args(config, dir + "/run") + " --resume auto --steps 3", 5,
                  "controller.bin was written by another gnmr (gnmr controller state: format "
                  "version 2, this build reads version 1)");
  EXPECT_EQ(output.find("damaged"), std::string::npos) << output;
}

// For a monitor: every metrics line says when it was written, each job's header which gnmr
// wrote it, and each job that ends says how in a "kind":"end" line (a stop and a complete run
// both exit 0).
TEST(CliTrain, EveryMetricsLineHasATimeAndEachJobAnEndLine) {
  std::string dir = gnmr_test::scratch_dir("cli_metrics_end");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 4}, "eval": {"every": 2}})");
  const std::string args = "train --config " + config + " --out " + dir + "/run";
  ASSERT_EQ(run_gnmr(args + " --stop-at 2").exit_code, 0);
  ASSERT_EQ(run_gnmr(args + " --resume auto").exit_code, 0);
  std::vector<nlohmann::json> ends;
  double previous = 0;
  // Each job's header names the build, as `gnmr version` does.
  const std::string version_output = run_gnmr("version").output;
  const std::string version = version_output.substr(0, version_output.find('\n'));
  for (const auto& line :
       gnmr_test::read_metrics(dir + "/run/metrics.jsonl", /*with_run_headers=*/true)) {
    ASSERT_TRUE(line["time"].is_number()) << line.dump();
    const double time = line["time"].get<double>();
    EXPECT_GE(time, previous) << line.dump();
    EXPECT_GT(time, 1.7e9) << line.dump();  // seconds since 1970, not since start-up
    previous = time;
    if (line["kind"] == "end") ends.push_back(line);
    if (line["kind"] == "run") {
      EXPECT_EQ("gnmr " + line["gnmr"].get<std::string>(), version);
    }
  }
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0]["step"], 2);
  EXPECT_EQ(ends[0]["reason"], "stopped");
  EXPECT_EQ(ends[0]["stopped_by"], "--stop-at");
  EXPECT_EQ(ends[1]["step"], 4);
  EXPECT_EQ(ends[1]["reason"], "complete");
}

// The start-up lines (said before the run directory may be touched) are in log.txt too, not
// only on stderr.
TEST(CliTrain, LogTxtHoldsTheStartUpWarnings) {
  std::string dir = gnmr_test::scratch_dir("cli_startup_log");
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"steps": 3, "warmup_steps": 5}, "eval": {"every": 0}})");
  auto r = run_gnmr("train --config " + config + " --out " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = gnmr_test::read_bytes(dir + "/run/log.txt");
  EXPECT_NE(log.find("warning train.warmup_steps 5 is not below train.steps 3"), std::string::npos)
      << log;
  EXPECT_NE(log.find("data.train: "), std::string::npos) << log;
  // In the order they were said: the build first, then the warnings, then the trainer's lines.
  EXPECT_EQ(log.find(" info gnmr 0."), std::string("2026-12-08 01:37:46").size()) << log;
  EXPECT_LT(log.find("train.warmup_steps 5"), log.find("model tiny: ")) << log;
}

TEST(CliTrain, NonFiniteStepIsSkippedAndCounted) {
  std::string dir = gnmr_test::scratch_dir("cli_nonfinite");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"debug": {"nonfinite_grad_steps": [3]}})");
  auto r = run_gnmr(train_args(config, dir + "/run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = gnmr_test::read_metrics(dir + "/run/metrics.jsonl");
  int skipped = 0;
  for (const auto& l : lines) {
    if (l["kind"] == "train" && l["skipped"].get<bool>()) {
      ++skipped;
      EXPECT_EQ(l["step"], 3);
    }
  }
  EXPECT_EQ(skipped, 1);
  auto trainer = nlohmann::json::parse(
      gnmr_test::read_bytes(dir + "/run/checkpoints/step_00000012/trainer.json"));
  EXPECT_EQ(trainer["skipped_steps"], 1);
}

// A validation loss that is not finite is an eval line too (null), and a warning: a monitor
// that waits for the eval lines must see the diverged model, not a gap.
TEST(CliTrain, ANonFiniteValidationLossIsWrittenAsNull) {
  std::string dir = gnmr_test::scratch_dir("cli_nonfinite_eval");
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"train": {"lr": 1e6, "grad_clip": 0, "max_nonfinite_steps": 100}})");
  const std::string output = expect_gnmr(train_args(config, dir + "/run"), 0, "is not finite");
  int evals = 0;
  for (const auto& l : gnmr_test::read_metrics(dir + "/run/metrics.jsonl")) {
    if (l["kind"] != "eval") continue;
    ++evals;
    EXPECT_TRUE(l["val_loss"].is_null() || l["val_loss"].is_number()) << l.dump();
    if (l["step"] == 12) {
      EXPECT_TRUE(l["val_loss"].is_null()) << l.dump() << "\n" << output;
    }
  }
  EXPECT_EQ(evals, 2);  // eval.every 6 of 12 steps
}

TEST(CliTrain, RepeatedNonFiniteStepsStopTheRunWithTheLastCheckpointIntact) {
  std::string dir = gnmr_test::scratch_dir("cli_diverged");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"debug": {"nonfinite_grad_steps": [8, 9, 10]}})");
  auto r = run_gnmr(train_args(config, dir + "/run"));
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_NE(r.output.find("step_00000006"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints/step_00000012"));
  const auto lines = gnmr_test::read_metrics(dir + "/run/metrics.jsonl", /*with_run_headers=*/true);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["kind"], "end");
  EXPECT_EQ(lines.back()["reason"], "diverged");
  EXPECT_EQ(lines.back()["step"], 10);
  double loss = eval_loss("--checkpoint " + dir + "/run/checkpoints/step_00000006 --data '" +
                          gnmr_test::brown_shards_dir() + "/val_*.bin' --tokens 2048");
  EXPECT_TRUE(std::isfinite(loss));
}

TEST(CliTrain, ExportedHfFolderEvaluatesToTheSameLossAndInitialisesTraining) {
  std::string dir = gnmr_test::scratch_dir("cli_export");
  std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 6}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run")).exit_code, 0);
  std::string ckpt = dir + "/run/checkpoints/step_00000006";
  auto exported = run_gnmr("export --checkpoint " + ckpt + " --out " + dir + "/hf");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model",
                        "generation_config.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/hf/" + f)) << f;
  }
  auto hf_config = nlohmann::json::parse(gnmr_test::read_bytes(dir + "/hf/config.json"));
  EXPECT_EQ(hf_config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(hf_config["hidden_size"], 64);
  // The special ids and pieces are the tokenizer's (the Brown tokenizer: <s> 1, </s> 2), and
  // its config asks for the BOS every training document starts with.
  auto generation =
      nlohmann::json::parse(gnmr_test::read_bytes(dir + "/hf/generation_config.json"));
  auto tokenizer = nlohmann::json::parse(gnmr_test::read_bytes(dir + "/hf/tokenizer_config.json"));
  EXPECT_EQ(hf_config["bos_token_id"], 1);
  EXPECT_EQ(hf_config["eos_token_id"], 2);
  EXPECT_EQ(generation["eos_token_id"], 2);
  EXPECT_EQ(tokenizer["bos_token"], "<s>");
  EXPECT_EQ(tokenizer["eos_token"], "</s>");
  EXPECT_EQ(tokenizer["add_bos_token"], true);
  // Exporting over an existing folder is refused.
  EXPECT_NE(run_gnmr("export --checkpoint " + ckpt + " --out " + dir + "/hf").exit_code, 0);

  std::string data =
      " --data '" + gnmr_test::brown_shards_dir() + "/val_*.bin' --tokens 4096 --seq-len 32";
  double from_checkpoint = eval_loss("--checkpoint " + ckpt + data);
  double from_hf = eval_loss("--checkpoint " + dir + "/hf" + data);
  EXPECT_EQ(from_checkpoint, from_hf);  // fp32 export: the same weights, bit for bit
  EXPECT_EQ(eval_loss("--checkpoint " + ckpt + data + " --backend cpu"), from_checkpoint);
  // The logged validation loss says how many tokens it scored (eval.tokens rounded down to
  // whole batches), and `gnmr eval --tokens` with that count scores the same windows.
  nlohmann::json logged;
  for (const auto& line : gnmr_test::read_metrics(dir + "/run/metrics.jsonl")) {
    if (line.value("kind", "") == "eval" && line["step"] == 6) logged = line;
  }
  ASSERT_TRUE(logged.contains("val_tokens")) << logged.dump();
  EXPECT_EQ(logged["val_tokens"], 1024);
  EXPECT_NEAR(eval_loss("--checkpoint " + ckpt + " --data '" + gnmr_test::brown_shards_dir() +
                        "/val_*.bin' --seq-len 32 --tokens " + logged["val_tokens"].dump()),
              logged["val_loss"].get<double>(), 1e-6);

  // A bfloat16 export differs only by weight rounding.
  ASSERT_EQ(run_gnmr("export --dtype bfloat16 --checkpoint " + ckpt + " --out " + dir + "/hf16")
                .exit_code,
            0);
  EXPECT_NEAR(eval_loss("--checkpoint " + dir + "/hf16" + data), from_checkpoint, 0.02);

  // --init from the HF folder: the first step's loss equals the checkpoint's eval loss regime.
  std::string config2 =
      gnmr_test::write_tiny_config(dir + "/..", R"({"train": {"steps": 1}, "eval": {"every": 0}})");
  auto init = run_gnmr(train_args(config2, dir + "/from_hf") + " --init " + dir + "/hf");
  ASSERT_EQ(init.exit_code, 0) << init.output;
  auto lines = gnmr_test::read_metrics(dir + "/from_hf/metrics.jsonl");
  EXPECT_LT(lines.front()["loss"].get<double>(),
            std::log(4096.0) - 0.5);  // far below a fresh model's ln(V)

  // Into another model: fewer layers (once loaded silently without the extra layer's
  // weights), the same shapes split into other heads, another norm epsilon (both once loaded
  // silently), weights of another tokenizer (the same ids, other words).
  const std::pair<const char*, const char*> other_models[] = {
      {R"({"model": {"n_layers": 1}})", "model.n_layers = 2, this run's is 1"},
      {R"({"model": {"n_heads": 8, "n_kv_heads": 8}})", "model.n_heads = 4, this run's is 8"},
      {R"({"model": {"norm_eps": 0.1}})", "model.norm_eps = 1e-05, this run's is 0.1"}};
  for (const auto& [overrides, message] : other_models) {
    nlohmann::json c = nlohmann::json::parse(overrides);
    c["train"] = {{"steps", 1}};
    c["eval"] = {{"every", 0}};
    std::string other =
        gnmr_test::write_tiny_config(gnmr_test::scratch_dir("cli_export_other_model"), c.dump());
    auto refused = run_gnmr(train_args(other, dir + "/other_model") + " --init " + dir + "/hf");
    EXPECT_EQ(refused.exit_code, 5) << overrides << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
    EXPECT_FALSE(fs::exists(dir + "/other_model")) << overrides;
  }
  fs::copy(dir + "/hf", dir + "/hf_other_tokenizer");
  std::ofstream(dir + "/hf_other_tokenizer/tokenizer.model", std::ios::trunc) << "another model";
  std::string same_model = gnmr_test::write_tiny_config(
      gnmr_test::scratch_dir("cli_export_same_model"), R"({"train": {"steps": 1}})");
  auto other_tokenizer = run_gnmr(train_args(same_model, dir + "/other_tokenizer") + " --init " +
                                  dir + "/hf_other_tokenizer");
  EXPECT_EQ(other_tokenizer.exit_code, 5) << other_tokenizer.output;
  EXPECT_NE(other_tokenizer.output.find("another tokenizer than data.tokenizer"), std::string::npos)
      << other_tokenizer.output;
  // A checkpoint trained with a CUDA-only attention kernel is read on the cpu (its config
  // check once refused "flash" there): the kernel is how attention was computed, not what.
  const std::string flash = dir + "/flash_checkpoint";
  fs::copy(ckpt, flash);
  fs::remove(flash + "/manifest.json");
  nlohmann::json flash_config =
      nlohmann::json::parse(gnmr_test::read_bytes(flash + "/config.json"));
  flash_config["model"]["attention"] = "flash";
  std::ofstream(flash + "/config.json", std::ios::trunc) << flash_config.dump();
  EXPECT_EQ(eval_loss("--checkpoint " + flash + data), from_checkpoint);
  auto from_flash = run_gnmr(train_args(same_model, dir + "/from_flash") + " --init " + flash);
  EXPECT_EQ(from_flash.exit_code, 0) << from_flash.output;
  // A run directory given for a checkpoint is named as one (it was read as an HF folder).
  auto run_dir = run_gnmr("eval --checkpoint " + dir + "/run" + data);
  EXPECT_EQ(run_dir.exit_code, 5) << run_dir.output;
  EXPECT_NE(run_dir.output.find("is a run directory, not a checkpoint"), std::string::npos)
      << run_dir.output;
  // A damaged config.json in an HF folder is named as such (once: "optimizer.safetensors is
  // missing", as if the folder were a gnmr checkpoint).
  std::ofstream(dir + "/hf_other_tokenizer/config.json", std::ios::trunc) << "{\"model_type\":";
  auto damaged = run_gnmr("eval --checkpoint " + dir + "/hf_other_tokenizer" + data);
  EXPECT_EQ(damaged.exit_code, 5) << damaged.output;
  EXPECT_NE(damaged.output.find("config.json: invalid JSON"), std::string::npos) << damaged.output;
}

TEST(CliEval, TextFileAndTruncatedCheckpoint) {
  std::string dir = gnmr_test::scratch_dir("cli_eval");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 2}, "eval": {"every": 0}})");
  ASSERT_EQ(run_gnmr(train_args(config, dir + "/run")).exit_code, 0);
  std::string ckpt = dir + "/run/checkpoints/step_00000002";
  std::ofstream(dir + "/text.txt")
      << "The jury said it did find that many of Georgia's registration and election "
         "laws are outmoded or inadequate and often ambiguous. It recommended that "
         "Fulton legislators act to have these laws studied and revised.";
  auto r =
      run_gnmr("eval --checkpoint " + ckpt + " --text " + dir + "/text.txt --seq-len 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  EXPECT_GT(j["tokens"].get<int64_t>(), 0);
  EXPECT_EQ(j["tokens"].get<int64_t>() % 15, 0);  // 15 predictions per 16-token window
  EXPECT_NEAR(j["ppl"].get<double>(), std::exp(j["loss"].get<double>()),
              1e-6 * j["ppl"].get<double>());

  // A checkpoint from before manifests whose data.seq_len is not a length: named, and --seq-len
  // is the way out (1e300 was converted to int: undefined behaviour).
  const std::string old_ckpt = dir + "/old_checkpoint";
  fs::copy(ckpt, old_ckpt);
  fs::remove(old_ckpt + "/manifest.json");
  nlohmann::json saved = nlohmann::json::parse(gnmr_test::read_bytes(old_ckpt + "/config.json"));
  for (const nlohmann::json& seq_len : {nlohmann::json(1e300), nlohmann::json("16")}) {
    saved["data"]["seq_len"] = seq_len;
    std::ofstream(old_ckpt + "/config.json", std::ios::trunc) << saved.dump();
    auto odd = run_gnmr("eval --checkpoint " + old_ckpt + " --text " + dir + "/text.txt");
    EXPECT_EQ(odd.exit_code, 5) << odd.output;
    EXPECT_NE(odd.output.find("\"data.seq_len\" is " + seq_len.dump() +
                              ", not a sequence length; give --seq-len"),
              std::string::npos)
        << odd.output;
  }
  EXPECT_EQ(run_gnmr("eval --checkpoint " + old_ckpt + " --text " + dir + "/text.txt --seq-len 16")
                .exit_code,
            0);

  // Shards of another tokenizer than the checkpoint's: a loss over ids that mean other words.
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(3 + i % 500);
  gnmr::write_shard_atomic(dir + "/v512_000000.bin", tokens, 512);
  auto mismatch =
      run_gnmr("eval --checkpoint " + ckpt + " --data '" + dir + "/v512_*.bin' --seq-len 16");
  EXPECT_EQ(mismatch.exit_code, 4) << mismatch.output;
  EXPECT_NE(mismatch.output.find("were made with a tokenizer of 512 pieces (their header), the "
                                 "model was trained with " +
                                 ckpt + "/tokenizer.model of 4096"),
            std::string::npos)
      << mismatch.output;
  // --text with a --tokenizer other than the checkpoint's: the same, once without a word. The
  // checkpoint's own tokenizer under another name is its tokenizer.
  {
    std::ofstream corpus(dir + "/corpus.txt");
    for (int i = 0; i < 400; ++i) corpus << "Line " << i << " of a small corpus about rivers.\n";
  }
  ASSERT_EQ(
      run_gnmr("tokenizer train --vocab-size 300 --out " + dir + "/other " + dir + "/corpus.txt")
          .exit_code,
      0);
  auto other = run_gnmr("eval --checkpoint " + ckpt + " --text " + dir +
                        "/text.txt --seq-len 16 --tokenizer " + dir + "/other.model");
  EXPECT_EQ(other.exit_code, 4) << other.output;
  EXPECT_NE(other.output.find("is not the model's tokenizer"), std::string::npos) << other.output;
  // A --tokenizer that does not exist is a data error naming it (exit 4), as before the check.
  auto missing = run_gnmr("eval --checkpoint " + ckpt + " --text " + dir +
                          "/text.txt --seq-len 16 --tokenizer " + dir + "/none.model");
  EXPECT_EQ(missing.exit_code, 4) << missing.output;
  fs::copy_file(ckpt + "/tokenizer.model", dir + "/same.model");
  EXPECT_EQ(run_gnmr("eval --checkpoint " + ckpt + " --text " + dir +
                     "/text.txt --seq-len 16 --tokenizer " + dir + "/same.model")
                .exit_code,
            0);

  // Truncate the weights: the manifest names the damaged file, no crash.
  fs::resize_file(ckpt + "/model.safetensors", fs::file_size(ckpt + "/model.safetensors") / 2);
  auto bad = run_gnmr("eval --checkpoint " + ckpt + " --text " + dir + "/text.txt --seq-len 16");
  EXPECT_EQ(bad.exit_code, 5) << bad.output;
  EXPECT_NE(bad.output.find("model.safetensors is damaged (size mismatch"), std::string::npos)
      << bad.output;
}

TEST(CliTrain, TinyModelLearnsWellBelowTheUnigramEntropy) {
  // Unigram entropy of the training shards: what a model that ignores context achieves.
  std::string shards = gnmr_test::brown_shards_dir();
  std::map<int32_t, int64_t> counts;
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(shards)) {
    if (entry.path().filename().string().rfind("train_", 0) != 0) continue;
    gnmr::ShardReader shard(entry.path().string());
    for (int64_t i = 0; i < shard.token_count(); ++i) counts[shard.token(i)]++, total++;
  }
  double entropy = 0;
  for (const auto& [token, c] : counts) entropy -= double(c) / total * std::log(double(c) / total);

  std::string dir = gnmr_test::scratch_dir("cli_learns");
  const int steps = 250;
  std::string config = gnmr_test::write_tiny_config(
      dir,
      R"({"data": {"seq_len": 64}, "train": {"global_batch_tokens": 1024, "micro_batch": 8, "warmup_steps": 20,
               "lr": 0.01}, "eval": {"every": 0, "tokens": 16384}, "checkpoint": {"every": 0}})");
  auto r = run_gnmr(train_args(config, dir + "/run") + " --steps " + std::to_string(steps));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = gnmr_test::read_metrics(dir + "/run/metrics.jsonl");
  const auto& eval = lines.back();
  ASSERT_EQ(eval["kind"], "eval");
  double val_loss = eval["val_loss"].get<double>();
  std::printf("unigram entropy %.3f nats; validation loss after %d steps %.3f (ppl %.1f)\n",
              entropy, steps, val_loss, eval["val_ppl"].get<double>());
  // Well below: at least 0.5 nats under the unigram entropy (a 40% lower perplexity).
  EXPECT_LT(val_loss, entropy - 0.5);
}

// A rank that dies mid-run (SIGKILL at step 3, as a node failure looks to the others) ends the
// whole job with a non-zero exit instead of leaving rank 0 waiting in a collective; `timeout`
// bounds the test, and its exit 124 would mean a hang.
TEST(CliTrain, ARankKilledMidRunEndsTheJobInsteadOfHanging) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  std::string dir = gnmr_test::scratch_dir("cli_mpi_crash");
  std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"threads": 1}})");
  const auto r = gnmr_test::run_gnmr_mpi(
      GNMR_MPIEXEC, 2,
      train_args(config, dir + "/run") + " --set debug.crash_rank=1 --set debug.crash_step=3",
      "timeout 120");
  const std::string& output = r.output;
  ASSERT_NE(r.exit_code, -1) << output;
  EXPECT_NE(r.exit_code, 0) << output;
  EXPECT_NE(r.exit_code, 124) << "the job hung until timeout killed it:\n" << output;
  // No final checkpoint: the run did not pretend to finish.
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints/step_00000012")) << output;
}

// A rank that fails while the job is being set up (here: its node lacks the data) ends the
// whole job with that error's exit code, instead of leaving the other rank in its first
// collective. Open MPI's MPMD form (`A : B`) starts the ranks in working directories of their
// own, so the same config's relative data glob matches files on rank 0 only.
TEST(CliTrain, ARankThatFailsSetupEndsTheJobWithItsError) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_mpi_setup_failure");
  fs::create_directories(dir + "/with_data");
  fs::create_directories(dir + "/without_data");
  fs::create_directory_symlink(gnmr_test::brown_shards_dir(), dir + "/with_data/shards");
  const std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"threads": 1},
               "data": {"train": "shards/train_*.bin", "val": "shards/val_*.bin"}})");
  const std::string gnmr = "'" + gnmr_test::gnmr_binary() + "' " + train_args(config, dir + "/run");
  // run_gnmr_mpi starts the first program; -wdir before it would apply to both.
  const auto r = gnmr_test::run_gnmr_mpi(
      GNMR_MPIEXEC, 1,
      train_args(config, dir + "/run") + " : -np 1 -wdir " + dir + "/without_data " + gnmr,
      "env -C '" + dir + "/with_data' timeout 120");
  EXPECT_NE(r.exit_code, 124) << "the job hung until timeout killed it:\n" << r.output;
  EXPECT_EQ(r.exit_code, 4) << r.output;  // ErrorKind::Data, rank 1's
  EXPECT_NE(r.output.find("rank 1: data.train: shards \"shards/train_*.bin\": no file matches"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << r.output;
}

// Ranks started with different configs stop before anything else, in train and in bench
// (which would otherwise sum gradients of different sizes).
TEST(CliTrain, RanksStartedWithDifferentConfigsStopAtOnce) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_mpi_config_mismatch");
  const std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"threads": 1}})");
  const std::string bench = "bench --config " + config + " --steps 1 --warmup 0";
  for (const std::string& args : {train_args(config, dir + "/run"), bench}) {
    const auto r = gnmr_test::run_gnmr_mpi(
        GNMR_MPIEXEC, 1,
        args + " : -np 1 '" + gnmr_test::gnmr_binary() + "' " + args + " --set train.lr=0.001",
        "timeout 120");
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;  // ErrorKind::Usage
    EXPECT_NE(r.output.find("the ranks of this job were started with different configs "
                            "(they differ in train.lr)"),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl"));
  // --stop-at is no config key: ranks given different ones once parted at the first one's
  // stop (one into the checkpoint, one into the next step) and waited for ever.
  const std::string train = train_args(config, dir + "/run");
  const auto r = gnmr_test::run_gnmr_mpi(
      GNMR_MPIEXEC, 1,
      train + " : -np 1 '" + gnmr_test::gnmr_binary() + "' " + train + " --stop-at 3",
      "timeout 120");
  EXPECT_NE(r.exit_code, 124) << "the job hung until timeout killed it:\n" << r.output;
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the ranks of this job were started with different --stop-at"),
            std::string::npos)
      << r.output;
}

TEST(CliTrain, TwoMpiRanksTrainAsOneDataParallelJobAndResume) {
  if (std::string(GNMR_MPIEXEC).empty()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  std::string dir = gnmr_test::scratch_dir("cli_mpi");
  std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"threads": 1}})");
  auto run = [](const std::string& args) { return gnmr_test::run_gnmr_mpi(GNMR_MPIEXEC, 2, args); };
  auto first = run(train_args(config, dir + "/run") + " --stop-at 6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run(train_args(config, dir + "/run") + " --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // One run directory, written once (rank 0), with every step and the final checkpoint.
  auto lines = gnmr_test::read_metrics(dir + "/run/metrics.jsonl");
  int train_lines = 0;
  for (const auto& l : lines) train_lines += l["kind"] == "train";
  EXPECT_EQ(train_lines, 12);
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000012/model.safetensors"));
  // A global batch that does not split over the ranks is refused with the reason.
  auto bad = run(train_args(config, dir + "/bad") + " --set train.global_batch_tokens=128");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("ranks"), std::string::npos) << bad.output;
}
