#include "util/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace fs = std::filesystem;

namespace gnmr {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// The pid at the end of NAME ("..._<pid>"), or -1.
long trailing_pid(const std::string& name) {
  const size_t underscore = name.rfind('_');
  if (underscore == std::string::npos || underscore + 1 == name.size()) return -1;
  long pid = 0;
  for (size_t i = underscore + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || pid > 1000000000L) return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

bool process_is_alive(long pid) {
  if (pid <= 0 || pid > 1000000000L) return false;
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::Runtime, "write " + path + ": " + errno_text());
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(ErrorKind::Runtime, "open " + path + " for fsync: " + errno_text());
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw Error(ErrorKind::Runtime, "fsync " + path + ": " + why);
  }
  if (::close(fd) != 0) throw Error(ErrorKind::Runtime, "close " + path + ": " + errno_text());
}

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(ErrorKind::Runtime, "create " + tmp + ": " + errno_text());
  try {
    write_all(fd, data, bytes, tmp);
    if (::fsync(fd) != 0) throw Error(ErrorKind::Runtime, "fsync " + tmp + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // NFS may report a failed write only at close().
  if (::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw Error(ErrorKind::Runtime, "close " + tmp + ": " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw Error(ErrorKind::Runtime, "rename " + tmp + " -> " + path + ": " + errno_text());
  }
  fs::path parent = fs::path(path).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

void publish_directory(const std::string& tmp_dir, const std::string& final_dir) {
  if (fs::exists(final_dir)) {
    throw Error(ErrorKind::Checkpoint, "refusing to replace existing directory " + final_dir);
  }
  for (const auto& entry : fs::recursive_directory_iterator(tmp_dir)) {
    if (entry.is_regular_file()) fsync_path(entry.path().string());
  }
  fsync_path(tmp_dir);
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    throw Error(ErrorKind::Runtime, "rename " + tmp_dir + " -> " + final_dir + ": " + errno_text());
  }
  fs::path parent = fs::path(final_dir).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

std::string without_trailing_separator(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p.string();
}

void remove_stale_temp_dirs(
    const std::string& dir, const std::string& prefix,
    const std::function<bool(const std::string& name)>& stale_whatever_pid) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !entry.is_directory(ec)) continue;
    const long pid = trailing_pid(name);
    if (pid <= 0 || pid == long(::getpid())) continue;  // not ours, or our own
    const bool stale_anyway = stale_whatever_pid && stale_whatever_pid(name);
    if (!stale_anyway && process_is_alive(pid)) {
      spdlog::warn("{} belongs to running process {}; left alone", entry.path().string(), pid);
      continue;
    }
    fs::remove_all(entry.path(), ec);
    if (ec) {
      spdlog::warn("cannot remove stale temporary directory {}: {}", entry.path().string(),
                   ec.message());
    } else {
      spdlog::info("removed stale temporary directory {} (left by a failed write)",
                   entry.path().string());
    }
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Runtime, "cannot open " + path + ": " + errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace gnmr
