#include "runtime/checkpoint/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/base/check.h"
#include "runtime/base/error.h"

namespace strata {

DirLock::DirLock(const std::string& dir) {
  const std::string path = dir + "/" + kFileName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw InputError(path, "checkpoint.dir",
                     std::string("a directory this run can lock (") + std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (err == EWOULDBLOCK)
      throw InputError(path, "checkpoint.dir",
                       "a checkpoint directory no other run uses; another run holds it" +
                           (who.empty() ? std::string() : " (host and pid: " + who + ")") +
                           ": give this run a directory of its own, or wait for that run to end");
    throw InputError(path, "checkpoint.dir",
                     std::string("a directory this run can lock (") + std::strerror(err) + ")");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::string(host) + " " + std::to_string(::getpid()) + "\n";
  // Who holds it, for the next run's message; a failure to write only loses that.
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t w = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)w;
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace strata
