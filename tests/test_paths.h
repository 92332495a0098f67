// Where tests find the source tree and the gnmr binary, a scratch directory helper (removed
// after a passing test), and the one way tests damage a file. The paths are compiled in;
// GNMR_TEST_SOURCE_DIR and GNMR_TEST_BINARY override them at run time, for test binaries that
// travel in the GPU bundle (scripts/gpu_bundle.sh) to a machine where the build tree does not
// exist.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace gnmr_test {

inline std::string source_path(const std::string& rel) {
  const char* moved = std::getenv("GNMR_TEST_SOURCE_DIR");
  return std::string(moved ? moved : GNMR_SOURCE_DIR) + "/" + rel;
}
inline std::string gnmr_binary() {
  const char* moved = std::getenv("GNMR_TEST_BINARY");
  return moved ? moved : GNMR_BINARY;
}

// Removes the scratch directories a test made once it ends without a failure (the runs and
// checkpoints of one CI pass came to 1.3 GB a build tree); a failed test's stay for
// inspection, and GNMR_KEEP_SCRATCH=1 keeps every one. Directories made outside a test (a
// suite's setup, shared by its tests) stay.
class ScratchCleanup final : public ::testing::EmptyTestEventListener {
 public:
  static void track(const std::filesystem::path& dir) {
    static ScratchCleanup* const cleanup = [] {
      auto* listener = new ScratchCleanup;  // owned by GoogleTest's listener list
      ::testing::UnitTest::GetInstance()->listeners().Append(listener);
      return listener;
    }();
    if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr) {
      cleanup->dirs_.push_back(dir);
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const char* keep = std::getenv("GNMR_KEEP_SCRATCH");
    if (!info.result()->Failed() && !(keep != nullptr && std::string(keep) == "1")) {
      for (const std::filesystem::path& dir : dirs_) {
        std::error_code ignored;  // a directory the test removed itself is fine
        std::filesystem::remove_all(dir, ignored);
      }
    }
    dirs_.clear();
  }

 private:
  std::vector<std::filesystem::path> dirs_;
};

// A fresh, empty directory under the test's working directory, removed first if present, and
// again when the test passes (ScratchCleanup).
inline std::string scratch_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::current_path() / "scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  ScratchCleanup::track(p);
  return p.string();
}

// Flips the lowest bit of the byte at `offset` of the file at `path` (bit rot in a checkpoint).
inline void flip_byte(const std::string& path, std::streamoff offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(offset);
  char c = 0;
  file.read(&c, 1);
  c = char(c ^ 0x01);
  file.seekp(offset);
  file.write(&c, 1);
}

}  // namespace gnmr_test
