// One writer per directory: an exclusive lock on DIR/.gnmr.lock (a POSIX record lock, so NFS
// honours it too) for as long as a process writes DIR. `gnmr train` holds one on its run
// directory (a resubmitted job while the first still runs would otherwise replace its
// checkpoints), `gnmr prepare` on its output directory (two prepares would interleave their
// shards). The lock goes with the process, however it ends.
#pragma once

#include <string>

#include "util/error.h"

namespace gnmr {

class DirectoryLock {
 public:
  DirectoryLock() = default;
  // WHAT names the directory in messages ("run directory"); failures throw Error(KIND): the
  // holder's pid when another process holds the lock. On a filesystem without locks (NFS
  // mounted nolock, Lustre noflock) it warns and guards nothing.
  DirectoryLock(const std::string& dir, const std::string& what, ErrorKind kind);
  ~DirectoryLock();
  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  // Whether the lock was taken, or found unsupported by the filesystem (a warning said so).
  bool tried() const { return fd_ >= 0; }
  // Whether this process holds the lock (false where the filesystem has no locks).
  bool held() const { return held_; }
  // Removes the lock file, then releases the lock: for a directory that must be left without
  // it (prepare's output, or one it made and removes again). A process that opened the file
  // before the removal and locks it after finds that the file it locked is no longer the one
  // at the path, and locks that one instead (the constructor compares the two).
  void remove_and_release();

  // The process holding DIR's lock now, "pid N (of this host or another)"; "" when none does
  // or the filesystem cannot say. Creates nothing and takes no lock.
  static std::string holder(const std::string& dir);

 private:
  int fd_ = -1;
  bool held_ = false;
  std::string path_;
};

}  // namespace gnmr
