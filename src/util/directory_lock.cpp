#include "util/directory_lock.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace gnmr {

namespace {

// Whether FD is the file now at PATH: a lock taken on a file that a releasing holder removed
// in between (remove_and_release) guards nothing.
bool is_file_at(int fd, const std::string& path) {
  struct stat opened {
  }, named{};
  return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 &&
         opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
}

// The process holding a write lock on FD's file, as holder() says it; "" for none.
std::string lock_holder_of(int fd) {
  struct flock holder {};
  holder.l_type = F_WRLCK;
  holder.l_whence = SEEK_SET;
  if (::fcntl(fd, F_GETLK, &holder) != 0 || holder.l_type == F_UNLCK) return "";
  return "pid " + std::to_string(holder.l_pid) + " (of this host or another)";
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what, ErrorKind kind)
    : path_((fs::path(dir) / ".gnmr.lock").string()) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  int taken = -1;
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw Error(kind, what + " " + dir + ": cannot create " + path_ + " (" +
                            std::strerror(errno) + "); choose another --out");
    }
    taken = ::fcntl(fd_, F_SETLK, &lock);
    if (taken == 0 && !is_file_at(fd_, path_)) {
      ::close(fd_);  // locked a removed file: open the one now at the path
      fd_ = -1;
    }
  }
  if (fd_ < 0) throw Error(kind, what + " " + dir + ": " + path_ + " keeps being replaced");
  if (taken == 0) {
    held_ = true;
    return;
  }
  const int error = errno;
  const std::string holder = lock_holder_of(fd_);
  if (error == ENOLCK || error == ENOSYS || error == EOPNOTSUPP || error == EINVAL) {
    // A filesystem without locks (NFS mounted nolock, Lustre mounted noflock, some FUSE ones):
    // the process goes on unguarded, as before there was a lock. fd_ stays open, so tried()
    // holds and nobody asks again.
    spdlog::warn(
        "{} {}: its filesystem cannot lock {} ({}); nothing stops a second gnmr process from "
        "writing into it while this one runs",
        what, dir, path_, std::strerror(error));
    return;
  }
  ::close(fd_);
  fd_ = -1;
  if (error != EACCES && error != EAGAIN) {
    throw Error(kind,
                what + " " + dir + ": cannot lock " + path_ + " (" + std::strerror(error) + ")");
  }
  throw Error(kind, what + " " + dir + " is in use by another gnmr process: " +
                        (holder.empty() ? std::string("a process") : holder) + " holds " + path_ +
                        "; wait for it to end, or choose another --out");
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept
    : fd_(other.fd_), held_(other.held_), path_(std::move(other.path_)) {
  other.fd_ = -1;
  other.held_ = false;
}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    held_ = other.held_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
    other.held_ = false;
  }
  return *this;
}

std::string DirectoryLock::holder(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".gnmr.lock").string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string holder = lock_holder_of(fd);
  ::close(fd);
  return holder;
}

void DirectoryLock::remove_and_release() {
  if (fd_ < 0) return;
  std::remove(path_.c_str());
  ::close(fd_);
  fd_ = -1;
  held_ = false;
}

}  // namespace gnmr
