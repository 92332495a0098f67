// Crash-safe writes: a file or directory appears under its final name only when it is
// complete and fsync'd. Used by `prepare` (shards), checkpoints and exports.
#pragma once

#include <functional>
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

// PATH as a directory's own name: normalised, without a trailing separator ("out/" and
// "out/." are "out"), so that its parent is the directory it goes in, not itself.
std::string without_trailing_separator(const std::string& path);

// Removes what a failed or killed writer left in DIR: directories named PREFIX..._<pid>
// (publish_directory's temporaries) whose pid is no live process on this host, logging each.
// A live pid's directory may be another process still writing, and a name without a pid is
// not a gnmr temporary: both are left alone. STALE_WHATEVER_PID: names whose every writer takes
// a lock the caller now holds (util/directory_lock.h), so they are stale whatever process their
// pid names now (pids are reused: a container's gnmr is often pid 1 after every restart).
void remove_stale_temp_dirs(
    const std::string& dir, const std::string& prefix,
    const std::function<bool(const std::string& name)>& stale_whatever_pid = nullptr);

// Reads a whole file; throws Error(kind) naming the path if it cannot.
std::string read_file(const std::string& path);

}  // namespace gnmr
