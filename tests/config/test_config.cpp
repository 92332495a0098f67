// Config loading: includes, overrides, defaults, and every validation error naming its field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "expect_error.h"
#include "test_paths.h"
#include "util/error.h"

using gnmr::ErrorKind;
using gnmr::load_run_config;

namespace {

std::string write_config(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = dir + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

// Expects a Config error whose message contains `needle`.
void expect_config_error(const std::string& file, const std::vector<std::string>& overrides,
                         const std::string& needle) {
  gnmr_test::expect_error([&] { load_run_config(file, overrides); }, ErrorKind::Config, {needle});
}

}  // namespace

TEST(ConfigLoad, DefaultsFillEveryUnsetField) {
  std::string dir = gnmr_test::scratch_dir("config_defaults");
  auto c = load_run_config(write_config(dir, "a.json", "{}"), {});
  EXPECT_EQ(c.model.dim, 64);
  EXPECT_EQ(c.train.micro_batch, 8);
  EXPECT_EQ(c.data.sampling, "random");
  EXPECT_TRUE(c.resolved.contains("gnmr"));
  EXPECT_EQ(c.resolved["train"]["lr"], 3e-3);
}

TEST(ConfigLoad, IncludesMergeInOrderAndTheIncludingFileWins) {
  std::string dir = gnmr_test::scratch_dir("config_include");
  write_config(dir, "presets/model.json",
               R"({"model": {"dim": 128, "n_heads": 8, "n_kv_heads": 8}})");
  write_config(dir, "presets/recipe.json", R"({"model": {"dim": 256}, "train": {"lr": 1e-4}})");
  auto path = write_config(
      dir, "run.json",
      R"({"include": ["presets/model.json", "presets/recipe.json"], "train": {"lr": 2e-4}})");
  auto c = load_run_config(path, {});
  EXPECT_EQ(c.model.dim, 256);         // second include overrides the first
  EXPECT_EQ(c.model.n_heads, 8);       // kept from the first include
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-4);  // the including file wins
}

TEST(ConfigLoad, RepoPresetsResolve) {
  auto c = load_run_config(gnmr_test::source_path("configs/quickstart.json"), {});
  EXPECT_EQ(c.model.name, "tiny");
  EXPECT_EQ(c.data.tokenizer, "data/brown/tokenizer.model");
  for (const char* preset :
       {"llama2-60m", "llama2-130m", "llama2-350m", "llama2-1b", "llama2-7b", "llama2-13b"}) {
    auto m = load_run_config(
        gnmr_test::source_path(std::string("configs/models/") + preset + ".json"), {});
    EXPECT_EQ(m.model.name, preset);
    EXPECT_EQ(m.model.vocab_size, 32000);
  }
  auto gpu = load_run_config(gnmr_test::source_path("configs/models/llama2-1b-gpu.json"), {});
  EXPECT_EQ(gpu.model.ffn_dim, 5632);  // a multiple of 128: FP8 GEMMs take it
  EXPECT_EQ(gpu.model.dim, 2048);
  auto bench =
      load_run_config(gnmr_test::source_path("configs/bench/llama2-1b-gpu-seq1024.json"), {});
  EXPECT_EQ(bench.data.seq_len, 1024);
  EXPECT_EQ(bench.model.name, "llama2-1b-gpu");
  auto tiny_gpu = load_run_config(gnmr_test::source_path("configs/models/tiny-gpu.json"), {});
  EXPECT_NE(tiny_gpu.model.n_heads, tiny_gpu.model.n_kv_heads);  // GQA
  auto m60 = load_run_config(gnmr_test::source_path("configs/models/llama2-60m.json"), {});
  EXPECT_EQ(m60.model.dim, 512);
  EXPECT_EQ(m60.model.ffn_dim, 1376);
}

TEST(ConfigLoad, EveryShippedConfigResolves) {
  namespace fs = std::filesystem;
  int checked = 0;
  for (const auto& entry : fs::recursive_directory_iterator(gnmr_test::source_path("configs"))) {
    if (entry.path().extension() != ".json") continue;
    if (entry.path().parent_path().filename() == "experiments")
      continue;  // table specs, not run configs
    EXPECT_NO_THROW(load_run_config(entry.path().string(), {})) << entry.path();
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

TEST(ConfigLoad, OverridesParseJsonValuesAndStrings) {
  std::string dir = gnmr_test::scratch_dir("config_override");
  auto path = write_config(dir, "a.json", "{}");
  auto c = load_run_config(path, {"train.lr=3e-4", "gnmr.max_active=8", "data.sampling=sequential",
                                  "data.train=\"x/*.bin\""});
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.gnmr.max_active, 8);
  EXPECT_EQ(c.data.sampling, "sequential");
  EXPECT_EQ(c.data.train, "x/*.bin");
}

TEST(ConfigErrors, UnknownKeySuggestsTheNearestValidKey) {
  std::string dir = gnmr_test::scratch_dir("config_unknown");
  expect_config_error(write_config(dir, "a.json", R"({"train": {"lrr": 1}})"), {},
                      "unknown key \"train.lrr\" (did you mean \"train.lr\"?)");
  expect_config_error(write_config(dir, "b.json", "{}"), {"train.lrr=1"},
                      "did you mean \"train.lr\"");
  expect_config_error(write_config(dir, "c.json", "{}"), {"micro_batch=2"},
                      "did you mean \"train.micro_batch\"");
  expect_config_error(write_config(dir, "d.json", R"({"modle": {}})"), {},
                      "did you mean \"model\"");
  // The paper's names, too far from ours for an edit distance.
  expect_config_error(write_config(dir, "e.json", "{}"), {"gnmr.maxO=2"},
                      "unknown key \"gnmr.maxO\" in --set gnmr.maxO=2 (the paper's name for "
                      "\"gnmr.max_active\")");
  expect_config_error(write_config(dir, "f.json", R"({"gnmr": {"T_lock": 5}})"), {},
                      "the paper's name for \"gnmr.lock_steps\"");
}

// A key's type is its default's JSON type: the timeouts, seconds held as doubles, once had
// integer defaults, and --set dist.timeout_s=1.5 was refused as "must be an integer".
TEST(ConfigLoad, SecondsTakeFractionsAndWholeNumbers) {
  std::string dir = gnmr_test::scratch_dir("config_seconds");
  auto path = write_config(dir, "a.json", R"({"dist": {"checkpoint_timeout_s": 7200}})");
  auto c = load_run_config(path, {"dist.timeout_s=1.5", "train.beta2=0.99"});
  EXPECT_DOUBLE_EQ(c.dist.timeout_s, 1.5);
  EXPECT_DOUBLE_EQ(c.dist.checkpoint_timeout_s, 7200);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.99);
}

TEST(ConfigErrors, WrongTypesNameTheField) {
  std::string dir = gnmr_test::scratch_dir("config_types");
  expect_config_error(write_config(dir, "a.json", R"({"model": {"dim": "big"}})"), {},
                      "\"model.dim\" must be an integer");
  expect_config_error(write_config(dir, "b.json", R"({"model": {"dim": 64.5}})"), {},
                      "\"model.dim\" must be an integer");
  expect_config_error(write_config(dir, "c.json", "{}"), {"train.lr=fast"},
                      "\"train.lr\" must be a number");
  expect_config_error(write_config(dir, "d.json", R"({"train": 3})"), {},
                      "\"train\" must be an object");
}

TEST(ConfigErrors, ImpossibleValuesNameTheField) {
  std::string dir = gnmr_test::scratch_dir("config_values");
  auto path = write_config(dir, "a.json", "{}");
  expect_config_error(path, {"model.n_heads=5"},
                      "\"model.n_heads\" (5) must divide model.dim (64)");
  expect_config_error(path, {"model.n_kv_heads=3"},
                      "\"model.n_kv_heads\" (3) must divide model.n_heads");
  expect_config_error(path, {"data.seq_len=512"},
                      "\"data.seq_len\" (512) must be <= model.max_seq_len (256)");
  expect_config_error(path, {"gnmr.max_active=-1"}, "gnmr.max_active: must be >= 0");
  expect_config_error(path, {"train.global_batch_tokens=1000"}, "\"train.global_batch_tokens\"");
  expect_config_error(path, {"data.sampling=shuffle"},
                      "\"data.sampling\" is \"shuffle\", must be one of");
  expect_config_error(path, {"train.steps=0"}, "\"train.steps\" must be > 0");
  expect_config_error(path, {"precision.recipe=fp2"}, "\"precision.recipe\"");
}

TEST(ConfigErrors, BadFilesAreNamed) {
  std::string dir = gnmr_test::scratch_dir("config_files");
  expect_config_error(dir + "/missing.json", {}, "config file " + dir + "/missing.json not found");
  expect_config_error(dir, {}, dir + " is a directory, not a config file");
  expect_config_error(write_config(dir, "bad.json", "{\"model\": "), {}, "invalid JSON");
  expect_config_error(write_config(dir, "inc.json", R"({"include": "nope.json"})"), {},
                      "nope.json does not exist");
  write_config(dir, "loop_a.json", R"({"include": "loop_b.json"})");
  expect_config_error(write_config(dir, "loop_b.json", R"({"include": "loop_a.json"})"), {},
                      "include cycle");
  expect_config_error(write_config(dir, "e.json", "{}"), {"train.lr"},
                      "must look like KEY.PATH=VALUE");
}

TEST(ConfigLoad, ResolvedJsonRoundTripsThroughRunConfigFromJson) {
  auto c = load_run_config(gnmr_test::source_path("configs/quickstart.json"), {"train.lr=1e-3"});
  auto again = gnmr::run_config_from_json(c.resolved);
  EXPECT_EQ(again.resolved, c.resolved);
  EXPECT_DOUBLE_EQ(again.train.lr, 1e-3);
}

// Found while writing fuzz_config (its typed-fields property): a 64-bit integer was
// narrowed to the field's type, so model.dim=4294967360 ran as dim 64.
TEST(ConfigErrors, IntegersOutsideTheirFieldsTypeNameTheField) {
  std::string dir = gnmr_test::scratch_dir("config_ranges");
  auto path = write_config(dir, "a.json", "{}");
  expect_config_error(path, {"model.dim=4294967360"},
                      "\"model.dim\" is 4294967360, outside the range of its type");
  expect_config_error(path, {"train.micro_batch=-4294967288"}, "\"train.micro_batch\"");
  expect_config_error(path, {"train.steps=9223372036854775808"}, "\"train.steps\"");
  expect_config_error(path, {"train.seed=-1"}, "\"train.seed\" is -1");
  auto c = load_run_config(path, {"train.seed=18446744073709551615", "train.steps=4294967296"});
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_EQ(c.train.steps, 4294967296);
}

// Found by fuzz_config: an include naming a directory escaped as std::ios_base::failure,
// and one whose name the OS refuses (over 255 bytes) as std::filesystem_error.
TEST(ConfigErrors, IncludesOfADirectoryOrAnImpossibleNameAreConfigErrors) {
  std::string dir = gnmr_test::scratch_dir("config_odd_includes");
  std::filesystem::create_directories(dir + "/sub");
  expect_config_error(write_config(dir, "a.json", R"({"include": "sub"})"), {},
                      "sub is a directory, not a config file");
  const std::string long_name = std::string(300, 'x') + ".json";
  expect_config_error(write_config(dir, "b.json", R"({"include": ")" + long_name + "\"}"), {},
                      "b.json: included file " + dir + "/" + long_name + ": File name too long");
  expect_config_error(dir, {}, "is a directory, not a config file");
}

// Found by fuzz_config: a number too large for a double ("lr": 1e3007360) made the JSON
// parser throw json::out_of_range, which escaped the loader (exit 1).
TEST(ConfigErrors, NumberTooLargeForADoubleIsInvalidJson) {
  std::string dir = gnmr_test::scratch_dir("config_huge_number");
  expect_config_error(write_config(dir, "a.json", R"({"train": {"lr": 0.00141e3007360}})"), {},
                      "a.json: invalid JSON");
}

TEST(ConfigLoad, ModelAttentionDefaultsToAutoAndFlashNeedsTheCudaBackend) {
  std::string dir = gnmr_test::scratch_dir("config_attention");
  const std::string path = write_config(dir, "a.json", "{}");
  EXPECT_EQ(load_run_config(path, {}).model.attention, "auto");
  EXPECT_EQ(load_run_config(path, {"model.attention=materialized"}).model.attention,
            "materialized");
  EXPECT_EQ(load_run_config(path, {"backend=cuda", "model.attention=flash"}).model.attention,
            "flash");
  EXPECT_EQ(load_run_config(path, {"backend=cuda", "model.attention=flash_bf16"}).model.attention,
            "flash_bf16");
  expect_config_error(path, {"model.attention=flash"},
                      "is \"flash\", which runs only on backend=cuda");
  expect_config_error(path, {"model.attention=flash_bf16"},
                      "is \"flash_bf16\", which runs only on backend=cuda");
  EXPECT_EQ(load_run_config(path, {"backend=cuda", "model.attention=flash_wgmma"}).model.attention,
            "flash_wgmma");
  expect_config_error(path, {"model.attention=flash_wgmma"},
                      "is \"flash_wgmma\", which runs only on backend=cuda");
  expect_config_error(path, {"model.attention=fused"}, "\"model.attention\" is \"fused\"");
}

TEST(ConfigLoad, DistBucketsDefaultTo25MiBAndTheCheckTo100Steps) {
  std::string dir = gnmr_test::scratch_dir("config_dist");
  auto path = write_config(dir, "a.json", "{}");
  auto c = load_run_config(path, {});
  EXPECT_EQ(c.dist.bucket_mb, 25.0);
  EXPECT_EQ(c.dist.check_every, 100);
  // A whole number of MiB is a number too; fractions make buckets for tiny models.
  EXPECT_EQ(load_run_config(path, {"dist.bucket_mb=4"}).dist.bucket_mb, 4.0);
  EXPECT_EQ(load_run_config(path, {"dist.bucket_mb=0.5"}).dist.bucket_mb, 0.5);
  EXPECT_EQ(load_run_config(path, {"dist.bucket_mb=0"}).dist.bucket_mb, 0.0);
  expect_config_error(path, {"dist.bucket_mb=-1"}, "\"dist.bucket_mb\" must be >= 0");
  expect_config_error(path, {"dist.check_every=-5"}, "\"dist.check_every\" must be >= 0");
  expect_config_error(path, {"dist.check_every=2.5"}, "\"dist.check_every\" must be");
}

// The checkpoint's waits get their own deadline, an hour unless set (a 7B checkpoint with its
// moments is about 84 GB).
TEST(ConfigLoad, DistDeadlinesDefaultToTenMinutesAndAnHourAroundCheckpoints) {
  std::string dir = gnmr_test::scratch_dir("config_dist_deadlines");
  auto path = write_config(dir, "a.json", "{}");
  auto c = load_run_config(path, {});
  EXPECT_EQ(c.dist.timeout_s, 600.0);
  EXPECT_EQ(c.dist.checkpoint_timeout_s, 3600.0);
  EXPECT_EQ(load_run_config(path, {"dist.checkpoint_timeout_s=7200"}).dist.checkpoint_timeout_s,
            7200.0);
  expect_config_error(path, {"dist.checkpoint_timeout_s=0"},
                      "\"dist.checkpoint_timeout_s\" must be > 0");
  expect_config_error(path, {"dist.timeout_s=-1"}, "\"dist.timeout_s\" must be > 0");
}

TEST(ConfigLoad, DistRendezvousIsTcpOrFileAndFileNeedsItsDirectory) {
  std::string dir = gnmr_test::scratch_dir("config_rendezvous");
  const std::string path = write_config(dir, "a.json", "{}");
  EXPECT_EQ(load_run_config(path, {}).dist.rendezvous, "tcp");
  EXPECT_EQ(load_run_config(path, {}).dist.rendezvous_dir, "");
  const gnmr::RunConfig file =
      load_run_config(path, {"dist.rendezvous=file", "dist.rendezvous_dir=/shared/rdv"});
  EXPECT_EQ(file.dist.rendezvous, "file");
  EXPECT_EQ(file.dist.rendezvous_dir, "/shared/rdv");
  expect_config_error(path, {"dist.rendezvous=nfs"},
                      "\"dist.rendezvous\" is \"nfs\", must be one of: file, tcp");
  expect_config_error(path, {"dist.rendezvous=file"},
                      "\"dist.rendezvous_dir\" is empty, but dist.rendezvous is \"file\"");
  expect_config_error(path, {"dist.rendezvous_dir=/shared/rdv"},
                      "\"dist.rendezvous_dir\" is set, but dist.rendezvous is \"tcp\"");
}

TEST(ConfigLoad, DistZeroIsZeroOrOneOnEitherBackend) {
  std::string dir = gnmr_test::scratch_dir("config_zero");
  const std::string path = write_config(dir, "a.json", "{}");
  EXPECT_EQ(load_run_config(path, {}).dist.zero, 0);
  EXPECT_EQ(load_run_config(path, {"dist.zero=1"}).dist.zero, 1);
  // GPU ranks reduce-scatter and all-gather over NCCL (nccl_communicator.cpp).
  EXPECT_EQ(load_run_config(path, {"dist.zero=1", "backend=cuda"}).dist.zero, 1);
  expect_config_error(path, {"dist.zero=2"}, "\"dist.zero\" must be 0 (plain data parallel) or 1");
}
