// binary_io.cc — AtomicFile.
#include "runtime/data/binary_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "runtime/base/error.h"

namespace strata {
namespace binary_io {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_ == nullptr) {
    throw InputError(path_, "",
                     "a writable file, cannot create '" + tmp_ + "': " + std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (f_ != nullptr) std::fclose(f_);
  if (!renamed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, uint64_t n) {
  if (n == 0) return;
  if (std::fwrite(data, 1, static_cast<size_t>(n), f_) != n) {
    throw InputError(path_, byte_at(size_),
                     "a writable file, writing '" + tmp_ + "' failed: " + std::strerror(errno));
  }
  size_ += n;
}

void AtomicFile::close() {
  const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    throw InputError(path_, "",
                     "a writable file, completing '" + tmp_ + "' failed: " + std::strerror(err));
  }
}

void AtomicFile::check_destination() const {
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw InputError(path_, "", "a file path to write, but it is a directory");
}

void AtomicFile::rename() {
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    throw InputError(
        path_, "",
        "a writable path, renaming '" + tmp_ + "' to it failed: " + std::strerror(errno));
  }
  renamed_ = true;
}

}  // namespace binary_io
}  // namespace strata
