// Checkpoint integrity: the manifest names a missing or damaged file, --resume auto skips a
// damaged checkpoint, and a failed write (file size limit, as a full disk) leaves no
// temporary directory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "expect_error.h"
#include "test_paths.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/hf_format.h"
#include "train/session.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;
using gnmr::ErrorKind;
using gnmr_test::expect_error;

namespace {

gnmr::RunConfig tiny_config(int keep = 3) {
  std::vector<std::string> all = {"data.seq_len=16", "train.micro_batch=2",
                                  "train.global_batch_tokens=32", "train.threads=1",
                                  "checkpoint.keep=" + std::to_string(keep)};
  return gnmr::load_run_config(gnmr_test::source_path("configs/models/tiny.json"), all);
}

// A checkpoint of a freshly initialised tiny model at STEP; returns its directory.
std::string save_tiny_checkpoint(const std::string& run_dir, int64_t step, int keep = 3) {
  gnmr::RunConfig config = tiny_config(keep);
  gnmr::TrainingSession session(config, /*synthetic_data=*/true);
  session.state().step = step;
  session.save_controller_state();
  return gnmr::save_checkpoint(run_dir, config, session.backend(), session.model(),
                               session.optimizer(), session.state());
}

using gnmr_test::flip_byte;

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// Files larger than `bytes` cannot be written while it lives (write fails with EFBIG, as it
// fails with ENOSPC on a full disk); SIGXFSZ is ignored so the write returns the error.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

}  // namespace

TEST(CheckpointManifest, ASavedCheckpointVerifiesAndListsEveryFile) {
  std::string dir = save_tiny_checkpoint(gnmr_test::scratch_dir("ckpt_manifest"), 3);
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "");
  auto manifest = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  EXPECT_EQ(manifest["checksum"], "crc32");
  for (const std::string& name : gnmr::required_checkpoint_files()) {
    ASSERT_TRUE(manifest["files"].contains(name)) << name;
    EXPECT_EQ(manifest["files"][name]["bytes"].get<uint64_t>(), fs::file_size(dir + "/" + name));
  }
}

TEST(CheckpointManifest, AFlippedByteATruncationOrAMissingFileIsNamed) {
  std::string dir = save_tiny_checkpoint(gnmr_test::scratch_dir("ckpt_damage"), 3);
  const std::string weights = dir + "/model.safetensors";
  flip_byte(weights, std::streamoff(fs::file_size(weights) / 2));
  expect_error([&] { gnmr::verify_checkpoint(dir); }, ErrorKind::Checkpoint,
               {"checkpoint " + dir + ": model.safetensors is damaged",
                "checksum mismatch: manifest says crc32 ", ", file has crc32 "});
  flip_byte(weights, std::streamoff(fs::file_size(weights) / 2));  // repaired
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "");

  fs::resize_file(dir + "/optimizer.safetensors", 100);
  EXPECT_NE(gnmr::checkpoint_problem(dir).find("optimizer.safetensors is damaged (size mismatch: "
                                               "manifest says "),
            std::string::npos)
      << gnmr::checkpoint_problem(dir);
}

TEST(CheckpointManifest, EachMissingRequiredFileIsNamed) {
  std::string run = gnmr_test::scratch_dir("ckpt_missing");
  std::string dir = save_tiny_checkpoint(run, 3);
  for (const std::string& name : gnmr::required_checkpoint_files()) {
    fs::copy(dir, run + "/copy");
    fs::remove(run + "/copy/" + name);
    expect_error([&] { gnmr::verify_checkpoint(run + "/copy"); }, ErrorKind::Checkpoint,
                 {name + " is missing"});
    fs::remove_all(run + "/copy");
  }
}

TEST(CheckpointManifest, ACheckpointFromBeforeManifestsIsAcceptedWhenComplete) {
  std::string dir = save_tiny_checkpoint(gnmr_test::scratch_dir("ckpt_old"), 3);
  fs::remove(dir + "/manifest.json");
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "");
  fs::remove(dir + "/trainer.json");
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "trainer.json is missing");
}

TEST(CheckpointManifest, ADamagedManifestIsNamed) {
  std::string dir = save_tiny_checkpoint(gnmr_test::scratch_dir("ckpt_bad_manifest"), 3);
  std::ofstream(dir + "/manifest.json") << "{\"format\": \"gnmr-checkpoint-manifest\"";
  EXPECT_NE(gnmr::checkpoint_problem(dir).find("manifest.json is damaged"), std::string::npos)
      << gnmr::checkpoint_problem(dir);
}

// Found while writing fuzz_checkpoint_json: a format or version of the wrong type escaped as json's
// own type_error, and a version of 1e300 was converted to int (undefined behaviour).
TEST(CheckpointManifest, AFormatOrVersionOfTheWrongTypeIsNamed) {
  std::string dir = save_tiny_checkpoint(gnmr_test::scratch_dir("ckpt_manifest_types"), 3);
  const std::string good = gnmr::read_file(dir + "/manifest.json");
  const std::string format = "\"format\": \"gnmr-checkpoint-manifest\"";
  const std::string version = "\"version\": 1";
  ASSERT_NE(good.find(format), std::string::npos);
  ASSERT_NE(good.find(version), std::string::npos);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  for (const auto& [text, problem] : std::vector<std::pair<std::string, std::string>>{
           {with(format, "\"format\": 7"), "manifest.json is damaged"},
           {with(format, "\"format\": null"), "manifest.json is damaged"},
           {with(version, "\"version\": \"1\""), "manifest.json has version \"1\""},
           {with(version, "\"version\": 1e300"), "manifest.json has version 1e+300"},
           {with(version, "\"version\": 2"), "manifest.json has version 2"}}) {
    gnmr::write_file_atomic(dir + "/manifest.json", text);
    EXPECT_EQ(gnmr::checkpoint_problem(dir).rfind(problem, 0), 0u) << text << "\n"
                                                                   << gnmr::checkpoint_problem(dir);
  }
  gnmr::write_file_atomic(dir + "/manifest.json", good);
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "");
}

TEST(CheckpointResume, AutoSkipsADamagedNewestCheckpointForThePreviousOne) {
  std::string run = gnmr_test::scratch_dir("ckpt_auto");
  std::string older = save_tiny_checkpoint(run, 3);
  std::string newest = save_tiny_checkpoint(run, 6);
  std::vector<std::string> skipped;
  EXPECT_EQ(gnmr::newest_intact_checkpoint(run, skipped), newest);
  EXPECT_TRUE(skipped.empty());
  flip_byte(newest + "/model.safetensors", 200);
  EXPECT_EQ(gnmr::newest_intact_checkpoint(run, skipped), older);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step_00000006: model.safetensors is damaged"), std::string::npos)
      << skipped[0];
  fs::remove(older + "/controller.bin");
  expect_error([&] { gnmr::newest_intact_checkpoint(run, skipped); }, ErrorKind::Checkpoint,
               {"no intact checkpoint", "step_00000006: model.safetensors is damaged"});
  EXPECT_EQ(gnmr::newest_intact_checkpoint(gnmr_test::scratch_dir("ckpt_auto_empty"), skipped), "");
}

TEST(CheckpointResume, ResavingADamagedCheckpointReplacesIt) {
  std::string run = gnmr_test::scratch_dir("ckpt_resave");
  std::string dir = save_tiny_checkpoint(run, 3);
  flip_byte(dir + "/model.safetensors", 200);
  ASSERT_NE(gnmr::checkpoint_problem(dir), "");
  EXPECT_EQ(save_tiny_checkpoint(run, 3), dir);
  EXPECT_EQ(gnmr::checkpoint_problem(dir), "");
}

// checkpoint.keep once counted a damaged later checkpoint that --resume auto had skipped (step
// 6 here, resumed from 3): with keep = 1 the save at step 4 deleted step 3 and itself, leaving
// only the damaged one, and the next resume found nothing to resume from. Later steps are
// replaced when the run reaches them; they do not count.
TEST(CheckpointRotation, KeepCountsTheStepsUpToTheOneSavedNotDamagedLaterOnes) {
  std::string run = gnmr_test::scratch_dir("ckpt_keep_damaged_later");
  const std::string damaged = save_tiny_checkpoint(run, 6);
  flip_byte(damaged + "/model.safetensors", 200);
  save_tiny_checkpoint(run, 3);
  const std::string saved = save_tiny_checkpoint(run, 4, /*keep=*/1);
  std::vector<std::string> names = entries_of(run + "/checkpoints");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000004", "step_00000006"}));
  std::vector<std::string> skipped;
  EXPECT_EQ(gnmr::newest_intact_checkpoint(run, skipped), saved);
  // Reaching step 6 replaces the damaged one, and only then does keep = 1 remove step 4.
  save_tiny_checkpoint(run, 6, /*keep=*/1);
  EXPECT_EQ(entries_of(run + "/checkpoints"), std::vector<std::string>{"step_00000006"});
  EXPECT_EQ(gnmr::checkpoint_problem(damaged), "");
}

TEST(CheckpointWrite, AFailedWriteLeavesNoTemporaryDirectory) {
  std::string run = gnmr_test::scratch_dir("ckpt_fail");
  std::string older = save_tiny_checkpoint(run, 3);
  {
    // model.safetensors (about 2.5 MB) no longer fits; the small files would.
    FileSizeLimit limit(1 << 20);
    expect_error([&] { save_tiny_checkpoint(run, 6); }, ErrorKind::Runtime, {"model.safetensors"});
  }
  EXPECT_EQ(entries_of(run + "/checkpoints"), std::vector<std::string>{"step_00000003"});
  EXPECT_EQ(gnmr::checkpoint_problem(older), "");
}

TEST(CheckpointWrite, AFailedExportLeavesNoTemporaryDirectory) {
  std::string run = gnmr_test::scratch_dir("ckpt_export_fail");
  std::string dir = save_tiny_checkpoint(run, 3);
  {
    FileSizeLimit limit(1 << 20);
    expect_error([&] { gnmr::export_hf_model(dir, run + "/exports/hf", "float32"); },
                 ErrorKind::Runtime, {"model.safetensors"});
  }
  EXPECT_TRUE(entries_of(run + "/exports").empty());
}

TEST(CheckpointWrite, StaleTemporaryDirectoriesOfDeadProcessesAreRemoved) {
  std::string run = gnmr_test::scratch_dir("ckpt_stale");
  save_tiny_checkpoint(run, 3);
  const std::string root = run + "/checkpoints/";
  fs::create_directories(root + ".tmp_step_00000006_999999999");  // no such process
  std::ofstream(root + ".tmp_step_00000006_999999999/model.safetensors") << "partial";
  const std::string live = ".tmp_step_00000009_" + std::to_string(getppid());  // still running
  fs::create_directories(root + live);
  fs::create_directories(root + ".tmp_notes");  // no pid: not a gnmr temporary
  gnmr::remove_stale_checkpoint_temps(run, /*run_dir_locked=*/false);
  std::vector<std::string> left = entries_of(root);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".tmp_notes", live, "step_00000003"}));
  // The run directory's lock held: a live pid on a trainer's temporary is another process that
  // reused the killed writer's pid (a container's pid 1), and it goes too; a running
  // `checkpoint consolidate` (no lock) keeps its own.
  const std::string consolidating = ".tmp_step_00000003_consolidated_" + std::to_string(getppid());
  fs::create_directories(root + consolidating);
  gnmr::remove_stale_checkpoint_temps(run, /*run_dir_locked=*/true);
  left = entries_of(root);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".tmp_notes", consolidating, "step_00000003"}));
}
