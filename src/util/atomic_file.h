// Crash-safe writes: a file or directory appears under its final name only when it is
// complete and fsync'd. Used by `prepare` (shards), checkpoints and exports.
#pragma once

#include <string>

namespace gnmr {

// Writes bytes to PATH via PATH.tmp.<pid> + fsync + rename + fsync(parent dir).
void write_file_atomic(const std::string& path, const void* data, size_t bytes);
void write_file_atomic(const std::string& path, const std::string& text);

// fsync a file or a directory by path.
void fsync_path(const std::string& path);

// Publishes a fully written temporary directory under its final name: fsync every file
// in it, rename TMP_DIR -> FINAL_DIR, fsync the parent. FINAL_DIR must not exist.
void publish_directory(const std::string& tmp_dir, const std::string& final_dir);

// Reads a whole file; throws Error(kind) naming the path if it cannot.
std::string read_file(const std::string& path);

}  // namespace gnmr
