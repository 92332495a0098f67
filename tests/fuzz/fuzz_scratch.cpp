#include "fuzz_scratch.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace gnmr_fuzz {

namespace {

// Never destroyed, so the atexit handler can still read it.
const std::string* scratch = nullptr;

void remove_scratch() {
  std::error_code ignored;
  std::filesystem::remove_all(*scratch, ignored);
}

const std::string* make_scratch() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/gnmr_fuzz_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror(("mkdtemp " + pattern).c_str());
    std::abort();
  }
  scratch = new std::string(pattern);
  std::atexit(remove_scratch);
  return scratch;
}

}  // namespace

const std::string& scratch_dir() {
  static const std::string* dir = make_scratch();
  return *dir;
}

void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(("write " + path).c_str());
    std::abort();
  }
}

void check_error(const gnmr::Error& e, gnmr::ErrorKind expected) {
  if (e.kind() != expected || std::string(e.what()).empty()) {
    std::fprintf(stderr, "fuzz: error of kind %d (expected %d): %s\n", e.exit_code(),
                 static_cast<int>(expected), e.what());
    std::abort();
  }
}

}  // namespace gnmr_fuzz
