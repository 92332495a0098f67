// Bad input at the command line: every case exits non-zero with a message naming the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>
#include <vector>

#include "cli_fixture.h"
#include "data/shard.h"

using gnmr_test::run_gnmr;

namespace {
void expect_failure(const std::string& args, int exit_code, const std::string& needle) {
  auto r = run_gnmr(args);
  EXPECT_EQ(r.exit_code, exit_code) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}
}  // namespace

TEST(CliBasics, VersionAndHelpSucceed) {
  auto v = run_gnmr("version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.output.find("gnmr "), std::string::npos);
  EXPECT_EQ(run_gnmr("--help").exit_code, 0);
  EXPECT_EQ(run_gnmr("train --help").exit_code, 0);
}

// The version names the commit the binary was built from (util/build_id.h): a result, a log or
// a bug report says which code made it.
TEST(CliBasics, VersionNamesTheGitCommitOfTheBuild) {
  if (!std::filesystem::exists(gnmr_test::source_path(".git"))) {
    GTEST_SKIP() << "the source tree is not a git checkout: the version says \"git unknown\"";
  }
  auto v = run_gnmr("version");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  std::smatch m;
  const std::string first_line = v.output.substr(0, v.output.find('\n'));
  ASSERT_TRUE(std::regex_match(first_line, m,
                               std::regex(R"(gnmr \d+\.\d+\.\d+ \(git ([0-9a-f]{12})(-dirty)?\))")))
      << first_line << " (a build from a git checkout)";
  // A commit of this repository (a later one may be checked out since the build).
  auto known = gnmr_test::run_command("git -C '" + gnmr_test::source_path("") + "' cat-file -e " +
                                      m[1].str() + "^{commit} 2>&1");
  EXPECT_EQ(known.exit_code, 0) << m[1] << ": " << known.output;
  auto flag = run_gnmr("--version");
  EXPECT_EQ(flag.output.find(first_line.substr(5)), 0u) << flag.output;  // less "gnmr "
}

TEST(CliErrors, UsageErrorsExitTwo) {
  expect_failure("", 2, "subcommand");
  expect_failure("frobnicate", 2, "subcommand");
  expect_failure("train", 2, "--config");
  expect_failure("eval --checkpoint run --data 'x_*.bin' --backend tpu", 2, "--backend: tpu");
}

TEST(CliErrors, AMisspeltSubcommandIsNamedWithTheNearestOne) {
  expect_failure("trian", 2, "unknown subcommand \"trian\" (did you mean \"train\"?)");
  expect_failure("--log-level debug evl", 2, "unknown subcommand \"evl\" (did you mean \"eval\"?)");
  expect_failure("tokenizer trian", 2, "unknown subcommand \"trian\" (did you mean \"train\"?)");
  expect_failure("config shw", 2, "(did you mean \"show\"?)");
  auto r = run_gnmr("frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown subcommand \"frobnicate\"; gnmr takes one of: train, prepare"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("did you mean"), std::string::npos) << r.output;
}

// `gnmr wgmma-trial` is gnmr's own (train/wgmma_trial.h): neither --help nor the list of
// subcommands names it, and without a GPU it fails naming why.
TEST(CliErrors, TheHiddenWgmmaTrialIsNotOfferedAndWithoutAGpuSaysWhy) {
  const auto help = run_gnmr("--help");
  EXPECT_NE(help.output.find("version"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("wgmma"), std::string::npos) << help.output;
  const auto unknown = run_gnmr("wgmma");
  EXPECT_EQ(unknown.output.find("wgmma-trial"), std::string::npos) << unknown.output;
  expect_failure("wgmma-trial --device 0", 2, "--batch is required");
  const auto trial =
      run_gnmr("wgmma-trial --device 0 --batch 1 --seq 17 --heads 4 --kv-heads 2 --head-dim 64");
  if (trial.exit_code == 0) GTEST_SKIP() << "a GPU that runs wgmma: " << trial.output;
  EXPECT_TRUE(trial.exit_code == 1 || trial.exit_code == 7) << trial.output;
  EXPECT_NE(trial.output.find("gnmr: error: "), std::string::npos) << trial.output;
}

TEST(CliErrors, AMissingPathExitsWithTheCodeOfWhatItNames) {
  // Exit codes (README): a config 3, a data input 4, a checkpoint or model folder 5; never 2,
  // which is for a command line that does not parse.
  const std::string dir = gnmr_test::scratch_dir("cli_missing_paths");
  const std::string config = gnmr_test::write_tiny_config(dir);
  expect_failure("train --config " + dir + "/none.json --out " + dir + "/run", 3,
                 dir + "/none.json not found");
  expect_failure("train --config " + dir + " --out " + dir + "/run", 3, "is a directory");
  expect_failure("bench --config " + dir + "/none.json", 3, dir + "/none.json");
  expect_failure("config show --config " + dir + "/none.json", 3, dir + "/none.json");
  expect_failure("eval --checkpoint " + dir + "/none --data 'x_*.bin'", 5,
                 "--checkpoint " + dir + "/none: directory not found");
  expect_failure("eval --checkpoint " + config + " --data 'x_*.bin'", 5, "not a directory");
  expect_failure("eval --checkpoint " + dir + " --text " + dir + "/none.txt", 4,
                 "--text " + dir + "/none.txt: file not found");
  expect_failure("export --checkpoint " + dir + "/none --out " + dir + "/hf", 5,
                 "--checkpoint " + dir + "/none");
  expect_failure("export --checkpoint " + dir + " --out " + dir, 5, "already exists");
  expect_failure("train --config " + config + " --out " + dir + "/run --init " + dir + "/none", 5,
                 "--init " + dir + "/none");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << "a refused run made its directory";
  expect_failure("prepare --tokenizer " + dir + "/none.model --out " + dir + "/shards " + config, 4,
                 dir + "/none.model");
  expect_failure("tokenizer train --vocab-size 300 --out " + dir + "/tok " + dir + "/none.txt", 4,
                 dir + "/none.txt");
}

TEST(CliErrors, ACountFlagBelowItsMinimumSaysTheMinimum) {
  const std::string config = gnmr_test::source_path("configs/quickstart.json");
  for (const std::string& args :
       {"train --config " + config + " --steps 0", "bench --config " + config + " --steps 0",
        "train --config " + config + " --stop-at 0",
        std::string("prepare --shard-tokens 0 --tokenizer t.model --out o in.txt")}) {
    auto r = run_gnmr(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("must be at least 1 (got 0)"), std::string::npos) << r.output;
    EXPECT_LT(r.output.size(), 200u) << "a bound printed as a 300-digit number?\n" << r.output;
  }
  expect_failure("bench --config " + config + " --warmup -1", 2, "must be at least 0 (got -1)");
  expect_failure("bench --config " + config + " --threads -5", 2, "must be at least 0 (got -5)");
  expect_failure("train --config " + config + " --stop-at -3", 2, "must be at least 1 (got -3)");
  expect_failure("train --config " + config + " --resume ''", 2,
                 "must be 'auto' or a checkpoint directory (got an empty value)");
  // Past 64 bits: CLI11's conversion clamped it, and the run set out on 2^63 - 1 steps.
  expect_failure("train --config " + config + " --steps 99999999999999999999", 2,
                 "is out of range (got 99999999999999999999)");
  expect_failure("train --config " + config + " --steps 9223372036854775808", 2,
                 "is out of range (got 9223372036854775808)");
  // More threads than OpenMP can make crashed in the first parallel region.
  expect_failure("eval --checkpoint " + config + " --text " + config + " --threads 100000", 2,
                 "must be in [0, 1024] (got 100000)");
  expect_failure("eval --checkpoint " + config + " --text " + config + " --threads -1", 2,
                 "must be in [0, 1024] (got -1)");
  expect_failure("bench --config " + config + " --threads 100000", 3,
                 "\"train.threads\" must be in [0, 1024]");
}

TEST(CliErrors, TrainLoadsTheTokenizerBeforeTheFirstStep) {
  const std::string dir = gnmr_test::scratch_dir("cli_bad_tokenizer");
  std::ofstream(dir + "/random.model", std::ios::binary) << std::string(5000, '\x9c');
  std::filesystem::create_directories(dir + "/a_directory.model");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir + "/none.model", "file not found"},
      {dir + "/random.model", "not a valid sentencepiece model"},
      {dir + "/a_directory.model", "not a file"}};
  for (const auto& [tokenizer, why] : cases) {
    std::string config = gnmr_test::write_tiny_config(
        dir, R"({"data": {"tokenizer": ")" + tokenizer + R"("}, "train": {"steps": 2}})");
    auto r = run_gnmr("train --config " + config + " --out " + dir + "/run");
    EXPECT_EQ(r.exit_code, 4) << tokenizer << "\n" << r.output;
    EXPECT_NE(r.output.find("data.tokenizer: tokenizer " + tokenizer + ": " + why),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << tokenizer << ": a run was started";
  }
  // More pieces (the bundled 4096) than the model can embed is refused ...
  std::string config = gnmr_test::write_tiny_config(dir, R"({"model": {"vocab_size": 4000}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4,
                 "has 4096 pieces, more than model.vocab_size (4000)");
  // ... and so are shards made with more (no tokenizer named, so the shards' header is what
  // stops the run) ...
  config = gnmr_test::write_tiny_config(
      dir, R"({"model": {"vocab_size": 4000}, "data": {"tokenizer": ""}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4,
                 "vocab size 4096 in its header is more than the model's vocab size 4000");
  // ... while fewer (a vocabulary padded to a multiple of 128, as GPU runs do) trains.
  config = gnmr_test::write_tiny_config(
      dir, R"({"model": {"vocab_size": 4224}, "train": {"steps": 2}, "eval": {"every": 0}})");
  auto padded = run_gnmr("train --config " + config + " --out " + dir + "/padded");
  EXPECT_EQ(padded.exit_code, 0) << padded.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/padded/metrics.jsonl")) << padded.output;
}

TEST(CliErrors, BenchTrainsOnSyntheticTokensAndNeverReadsTheTokenizer) {
  const std::string dir = gnmr_test::scratch_dir("cli_bench_tokenizer");
  const std::string config =
      gnmr_test::write_tiny_config(dir, R"({"data": {"tokenizer": ")" + dir + R"(/none.model"}})");
  auto r = run_gnmr("bench --config " + config + " --steps 1 --warmup 0 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("none.model"), std::string::npos) << r.output;
}

TEST(CliErrors, ConfigErrorsExitThreeAndNameTheKey) {
  std::string config = gnmr_test::source_path("configs/quickstart.json");
  expect_failure("config show --config " + config + " --set train.lrr=1", 3,
                 "did you mean \"train.lr\"");
  expect_failure("config show --config " + config + " --set model.n_heads=5", 3, "model.n_heads");
  expect_failure("config show --config " + config + " --set gnmr.max_active=-2", 3,
                 "gnmr.max_active");
  // A count budget above the model's projection units (7 per layer) is named with the count.
  expect_failure(
      "config show --config " + config + " --set model.n_layers=2 --set gnmr.max_active=20", 3,
      "gnmr.max_active: 20 is more than the model's 14 projection units");
  auto ok = run_gnmr("config show --config " + config + " --set train.lr=0.5");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(nlohmann::json::parse(ok.output)["train"]["lr"], 0.5);
}

// A debug step list holding a number that is not an integer (1e300 was converted to int64:
// undefined behaviour) is a config error naming the list.
TEST(CliErrors, ADebugStepOrIndexThatIsNotAnIntegerOfItsRangeIsAConfigError) {
  const std::string dir = gnmr_test::scratch_dir("cli_debug_steps");
  const std::string config = gnmr_test::write_tiny_config(dir, "{}");
  for (const std::string steps : {"[1e300]", "[2.5]"}) {
    expect_failure("bench --config " + config + " --steps 1 --warmup 0 --threads 1 --set " +
                       "debug.spike_steps=" + steps,
                   3, "\"debug.spike_steps\" must hold integer steps, got ");
  }
  // Past an int: once truncated to unit 0 and rank 1, which exist.
  expect_failure("bench --config " + config +
                     " --steps 1 --warmup 0 --threads 1 --set debug.spike_unit=4294967296",
                 3, "\"debug.spike_unit\" must be an integer in [-1, 2147483647], got 4294967296");
  expect_failure("bench --config " + config +
                     " --steps 1 --warmup 0 --threads 1 --set debug.crash_rank=4294967297",
                 3, "\"debug.crash_rank\" must be an integer in [-1, 2147483647], got 4294967297");
}

TEST(CliErrors, MissingDataFilesExitFourAndNameTheField) {
  std::string dir = gnmr_test::scratch_dir("cli_missing_data");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"data": {"train": "/nonexistent/train_*.bin"}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4, "data.train");
}

// The evaluation after the last step needs one whole batch of validation windows: a budget or
// a validation set too small for it once failed there, after all the training, with no final
// checkpoint. Both are known at setup, and refused there.
TEST(CliErrors, AValidationBudgetOrSetSmallerThanOneBatchIsRefusedBeforeTheFirstStep) {
  const std::string dir = gnmr_test::scratch_dir("cli_small_validation");
  // micro_batch 4 x seq_len 32 = 128 tokens a batch.
  std::string config = gnmr_test::write_tiny_config(dir, R"({"eval": {"tokens": 100}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 3,
                 "eval.tokens 100 is less than one evaluation batch of 128 tokens");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
  // About 70 tokens of validation text: two windows of 33 tokens, where a batch needs four.
  std::string words;
  for (int i = 0; i < 60; ++i) words += (i % 2 ? "the " : "of ");
  std::ofstream(dir + "/val.txt") << words << "\n";
  auto prepared =
      run_gnmr("prepare --tokenizer " + gnmr_test::source_path("data/brown/tokenizer.model") +
               " --out " + dir + "/val --val-fraction 0 --no-progress " + dir + "/val.txt");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  config =
      gnmr_test::write_tiny_config(dir, R"({"data": {"val": ")" + dir + R"(/val/train_*.bin"}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4,
                 "fewer than one batch (train.micro_batch = 4)");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
}

// A shard's header holds the piece count of the tokenizer that made it. Shards of another
// tokenizer once trained without a word, and the checkpoints carried data.tokenizer, which
// decodes their ids as other words.
TEST(CliErrors, ShardsMadeWithAnotherTokenizerAreRefusedBeforeTheFirstStep) {
  const std::string dir = gnmr_test::scratch_dir("cli_shard_vocab");
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(3 + i % 500);
  std::filesystem::create_directories(dir + "/v512");
  std::filesystem::create_directories(dir + "/mixed");
  gnmr::write_shard_atomic(dir + "/v512/train_000000.bin", tokens, 512);
  gnmr::write_shard_atomic(dir + "/mixed/train_a.bin", tokens, 512);
  gnmr::write_shard_atomic(dir + "/mixed/train_b.bin", tokens, 4096);
  const std::string brown_val = gnmr_test::brown_shards_dir() + "/val_*.bin";
  // Shards of a 512-piece tokenizer, data.tokenizer the bundled 4096-piece one.
  std::string config = gnmr_test::write_tiny_config(
      dir, R"({"data": {"train": ")" + dir + R"(/v512/train_*.bin"}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4,
                 "data.train: shards " + dir +
                     "/v512/train_*.bin were made with a tokenizer of 512 pieces (their header), "
                     "but data.tokenizer " +
                     gnmr_test::source_path("data/brown/tokenizer.model") + " has 4096");
  // One glob holding both kinds.
  config = gnmr_test::write_tiny_config(
      dir, R"({"data": {"train": ")" + dir + R"(/mixed/train_*.bin", "tokenizer": ""}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4,
                 "the glob mixes shards made with different tokenizers");
  // No tokenizer named: train and val must still agree.
  config = gnmr_test::write_tiny_config(
      dir, R"({"data": {"train": ")" + dir + R"(/v512/train_*.bin", "tokenizer": ""}})");
  expect_failure("train --config " + config + " --out " + dir + "/run", 4,
                 "data.val: shards " + brown_val +
                     " were made with a tokenizer of 4096 pieces (their header), data.train's");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
}

TEST(CliErrors, PrepareWithMissingInputOrTokenizerExitsFour) {
  std::string dir = gnmr_test::scratch_dir("cli_prepare_missing");
  expect_failure("prepare --tokenizer " + gnmr_test::source_path("data/brown/tokenizer.model") +
                     " --out " + dir + "/out /nonexistent/corpus.jsonl",
                 4, "/nonexistent/corpus.jsonl");
  std::ofstream(dir + "/a.txt") << "hello world\n";
  expect_failure(
      "prepare --tokenizer /nonexistent/tok.model --out " + dir + "/out2 " + dir + "/a.txt", 4,
      "/nonexistent/tok.model");
}

// Settings valid one by one that together do nothing, or not what their names say, are
// warned about at start (a walkthrough found each accepted without a word).
TEST(CliErrors, SettingsThatTogetherDoNothingAreWarnedAtStart) {
  const std::string dir = gnmr_test::scratch_dir("cli_settings_doing_nothing");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"precision": {"recipe": "fp8mix", "low_format": "e4m3", "recovery_format": "e2m1"}})",
       "precision.recovery_format e2m1 has fewer bits than precision.low_format e4m3"},
      {R"({"precision": {"recipe": "actq", "low_bits": 8, "recovery_bits": 4}})",
       "precision.recovery_bits 4 is below precision.low_bits 8"},
      // 0.1 of a 1-layer model's 7 units rounds down to 0.
      {R"({"model": {"n_layers": 1}, "precision": {"recipe": "actq"}})",
       "gnmr.max_active 0.1 of 7 units rounds down to a budget of 0"},
      // 0.1 of 14 units is 1, and the smallest group (an MLP) has 3.
      {R"({"precision": {"recipe": "actq"}, "gnmr": {"granularity": "group"}})",
       "less than the smallest decision unit of gnmr.granularity group (3 units)"},
      {R"({"gnmr": {"alpha_final": 3}})", "gnmr.alpha_final / beta_final are not used"},
      {R"({"precision": {"recipe": "fp8mix", "low_format": "e4m3", "recovery_format": "e4m3"}})",
       "the recovery path is the low path (fp e4m3"},
      // Every case runs 1 step, and the tiny config warms up for 2.
      {"{}", "train.warmup_steps 2 is not below train.steps 1: the learning rate never reaches"}};
  for (const auto& [extra, warning] : cases) {
    nlohmann::json config_json = nlohmann::json::parse(extra);
    config_json["train"] = {{"steps", 1}};
    config_json["eval"] = {{"every", 0}};
    const std::string config = gnmr_test::write_tiny_config(dir, config_json.dump());
    std::filesystem::remove_all(dir + "/run");
    auto r = run_gnmr("train --config " + config + " --out " + dir + "/run");
    EXPECT_EQ(r.exit_code, 0) << extra << "\n" << r.output;
    EXPECT_NE(r.output.find(warning), std::string::npos) << extra << "\n" << r.output;
  }
  // The default recipe (fp32) has no low path: the controller's figures say so.
  const std::string config = gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 1}})");
  std::filesystem::remove_all(dir + "/run");
  auto r = run_gnmr("train --config " + config + " --out " + dir + "/run");
  EXPECT_NE(r.output.find("(precision.recipe fp32 has no low path"), std::string::npos) << r.output;
}
