// Where tests find the source tree and the gnmr binary, a scratch directory helper, and the
// one way tests damage a file. The paths are compiled in; GNMR_TEST_SOURCE_DIR and
// GNMR_TEST_BINARY override them at run time, for test binaries that travel in the GPU bundle
// (scripts/gpu_bundle.sh) to a machine where the build tree does not exist.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace gnmr_test {

inline std::string source_path(const std::string& rel) {
  const char* moved = std::getenv("GNMR_TEST_SOURCE_DIR");
  return std::string(moved ? moved : GNMR_SOURCE_DIR) + "/" + rel;
}
inline std::string gnmr_binary() {
  const char* moved = std::getenv("GNMR_TEST_BINARY");
  return moved ? moved : GNMR_BINARY;
}

// A fresh, empty directory under the test's working directory, removed first if present.
inline std::string scratch_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::current_path() / "scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
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
