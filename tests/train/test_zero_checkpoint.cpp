// ZeRO-1 optimizer state in checkpoints (train/zero_checkpoint.h), in one process: the manifest
// requires the shard files, and consolidating gives the moments plain AdamW has after the same
// steps (one rank: ZeRO-1 is the plain run).
#include <gtest/gtest.h>

#include <filesystem>

#include "config/config.h"
#include "expect_error.h"
#include "test_paths.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/safetensors.h"
#include "train/session.h"
#include "train/zero_checkpoint.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;
using gnmr::ErrorKind;
using gnmr_test::expect_error;

namespace {

gnmr::RunConfig tiny_config(int zero) {
  std::vector<std::string> all = {"data.seq_len=16", "train.micro_batch=2",
                                  "train.global_batch_tokens=32", "train.threads=1",
                                  "dist.zero=" + std::to_string(zero)};
  return gnmr::load_run_config(gnmr_test::source_path("configs/models/tiny.json"), all);
}

// Two steps on synthetic tokens, then a checkpoint; returns its directory.
std::string train_and_save(const std::string& run_dir, int zero) {
  gnmr::RunConfig config = tiny_config(zero);
  gnmr::TrainingSession session(config, /*synthetic_data=*/true);
  session.run_step(0);
  session.run_step(1);
  session.save_controller_state();
  if (gnmr::ZeroAdamW* z = session.zero_optimizer()) {
    return gnmr::save_checkpoint(run_dir, config, session.backend(), session.model(), *z,
                                 session.comm(), session.state());
  }
  return gnmr::save_checkpoint(run_dir, config, session.backend(), session.model(),
                               session.optimizer(), session.state());
}

std::vector<float> tensor(const gnmr::SafetensorsFile& file, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : file.shape(name)) n *= d;
  std::vector<float> values(static_cast<size_t>(n));
  file.read_f32(name, file.shape(name), values.data());
  return values;
}

}  // namespace

TEST(ZeroCheckpoint, TheManifestRequiresEveryShardFile) {
  const std::string dir = train_and_save(gnmr_test::scratch_dir("zero_ckpt_manifest"), 1);
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "");
  EXPECT_EQ(gnmr::zero_checkpoint_world_size(dir), 1);
  EXPECT_FALSE(fs::exists(dir + "/optimizer.safetensors"));
  fs::remove(dir + "/" + gnmr::zero_shard_file_name(0, 1));
  expect_error([&] { gnmr::verify_checkpoint(dir); }, ErrorKind::Checkpoint,
               {"optimizer.shard_0_of_1.safetensors is missing"});
}

// Found by fuzz_checkpoint_json and by reading it: a shard index whose world size wraps to a
// valid int (2^32 + 1 -> 1), whose shards' total overflows int64, or whose format or version
// has the wrong type is damaged, not read as a plausible index or escaping as json's error.
TEST(ZeroCheckpoint, AnIndexWithCountsThatWrapOrOverflowOrFieldsOfTheWrongTypeIsDamaged) {
  const std::string dir = train_and_save(gnmr_test::scratch_dir("zero_ckpt_index"), 1);
  const std::string index = dir + "/" + gnmr::kZeroShardsIndexName;
  nlohmann::json good = nlohmann::json::parse(gnmr::read_file(index));
  for (const auto& [world, shard] : std::vector<std::pair<int64_t, int64_t>>{
           {int64_t(1) << 32 | 1, good["shard_elements"]}, {4, int64_t(1) << 62}}) {
    nlohmann::json bad = good;
    bad["world_size"] = world;
    bad["shard_elements"] = shard;
    gnmr::write_file_atomic(index, bad.dump());
    expect_error([&] { gnmr::zero_checkpoint_world_size(dir); }, ErrorKind::Checkpoint,
                 {"optimizer_shards.json is damaged (inconsistent sizes)"});
  }
  // A format or version of the wrong type, or a version past int's range, is damaged too.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"format", 7}, {"version", "1"}, {"version", 1e300}}) {
    nlohmann::json bad = good;
    bad[key] = value;
    gnmr::write_file_atomic(index, bad.dump());
    expect_error([&] { gnmr::zero_checkpoint_world_size(dir); }, ErrorKind::Checkpoint,
                 {"optimizer_shards.json is damaged (not a version-1"});
  }
  gnmr::write_file_atomic(index, good.dump());
  EXPECT_EQ(gnmr::zero_checkpoint_world_size(dir), 1);
}

TEST(ZeroCheckpoint, ConsolidatedMomentsEqualPlainAdamWAfterTheSameSteps) {
  const std::string zero_dir = train_and_save(gnmr_test::scratch_dir("zero_ckpt_sharded"), 1);
  const std::string plain_dir = train_and_save(gnmr_test::scratch_dir("zero_ckpt_plain"), 0);
  const std::string out = gnmr_test::scratch_dir("zero_ckpt_out") + "/consolidated";
  gnmr::consolidate_checkpoint(zero_dir, out);
  EXPECT_EQ(gnmr::checkpoint_problem(out), "");
  EXPECT_EQ(gnmr::zero_checkpoint_world_size(out), 0);
  gnmr::SafetensorsFile consolidated(out + "/optimizer.safetensors");
  gnmr::SafetensorsFile plain(plain_dir + "/optimizer.safetensors");
  ASSERT_EQ(consolidated.names(), plain.names());
  for (const std::string& name : plain.names()) {
    EXPECT_EQ(tensor(consolidated, name), tensor(plain, name)) << name;
  }
  // Never over an existing directory, and not twice.
  expect_error([&] { gnmr::consolidate_checkpoint(zero_dir, out); }, ErrorKind::Checkpoint,
               {"already exists"});
  expect_error([&] { gnmr::consolidate_checkpoint(out, out + "_again"); }, ErrorKind::Usage,
               {"already holds consolidated optimizer state"});

  // A ZeRO-1 session reads the consolidated moments back into its shard.
  gnmr::RunConfig config = tiny_config(1);
  gnmr::TrainingSession session(config, /*synthetic_data=*/true);
  gnmr::load_checkpoint(out, config, session.backend(), session.model(), *session.zero_optimizer());
  gnmr::SafetensorsFile shard(zero_dir + "/" + gnmr::zero_shard_file_name(0, 1));
  std::vector<float> m(size_t(session.zero_optimizer()->first_moment_shard().numel()));
  session.backend().copy_to_host(session.zero_optimizer()->first_moment_shard(), m.data());
  EXPECT_EQ(m, tensor(shard, "m"));
  // The plain optimizer refuses the sharded checkpoint and names the fix.
  gnmr::RunConfig plain_config = tiny_config(0);
  gnmr::TrainingSession plain_session(plain_config, /*synthetic_data=*/true);
  expect_error(
      [&] {
        gnmr::load_checkpoint(zero_dir, plain_config, plain_session.backend(),
                              plain_session.model(), plain_session.optimizer());
      },
      ErrorKind::Checkpoint, {"sharded over 1 ranks", "gnmr checkpoint consolidate " + zero_dir});
}
