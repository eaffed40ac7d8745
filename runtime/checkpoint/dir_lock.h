// dir_lock.h — one run per checkpoint directory: an advisory lock (flock) on DIR/.strata.lock,
// held for as long as the object lives (the run), released by the kernel when the process ends
// however it ends. The file says who holds it ("host pid"), so that a second run can be refused
// naming the first. Two runs on one directory corrupted each other: one's cleanup removed the
// other's temporary save, and a resume took the other's checkpoint (another seed).
//
// Advisory: it excludes Strata runs, not other programs; on a network filesystem that does not
// implement flock it may not exclude runs on other hosts.
//
// Thread-safety: an object is used by one thread.
#pragma once

#include <string>

namespace strata {

class DirLock {
 public:
  // Locks `dir` (which must exist). InputError naming the directory's lock file and its holder
  // when another process holds it.
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  static constexpr const char* kFileName = ".strata.lock";

 private:
  int fd_ = -1;
};

}  // namespace strata
