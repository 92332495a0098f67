// Checks for flags that name a path. CLI11's ExistingFile/ExistingDirectory validators would
// exit 2 (a command line that does not parse); a missing path is a problem with what it names,
// so it exits with that thing's code (README "Exit codes"): a data input (corpus, --text,
// tokenizer) 4, a checkpoint or model folder 5, a config file 3.
#pragma once

#include <filesystem>
#include <string>

#include "util/error.h"

namespace gnmr {

inline void require_file(const std::string& flag, const std::string& path, ErrorKind kind) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(kind, flag + " " + path + ": file not found");
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(kind, flag + " " + path + ": not a regular file");
  }
}

inline void require_directory(const std::string& flag, const std::string& path, ErrorKind kind) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw Error(kind, flag + " " + path + ": directory not found");
  }
  if (!std::filesystem::is_directory(path, ec)) {
    throw Error(kind, flag + " " + path + ": not a directory");
  }
}

}  // namespace gnmr
