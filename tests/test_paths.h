// Where tests find the source tree and the gnmr binary, and a scratch directory helper.
#pragma once

#include <filesystem>
#include <string>

namespace gnmr_test {

inline std::string source_path(const std::string& rel) { return std::string(GNMR_SOURCE_DIR) + "/" + rel; }
inline std::string gnmr_binary() { return GNMR_BINARY; }

// A fresh, empty directory under the test's working directory, removed first if present.
inline std::string scratch_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::current_path() / "scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace gnmr_test
