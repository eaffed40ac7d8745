// mmap_file.cc — MappedFile over POSIX open/fstat/mmap.
#include "runtime/data/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "runtime/base/error.h"

namespace strata {
namespace {

int advice_of(MappedFile::Access a) {
  switch (a) {
    case MappedFile::Access::kRandom:
      return MADV_RANDOM;
    case MappedFile::Access::kSequential:
      return MADV_SEQUENTIAL;
    case MappedFile::Access::kWillNeed:
      return MADV_WILLNEED;
    case MappedFile::Access::kNormal:
      break;
  }
  return MADV_NORMAL;
}

// Closes a descriptor when it goes out of scope (the mapping outlives it).
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile MappedFile::open(const std::string& path, Access access) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below instead.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) {
    const int err = errno;
    throw InputError(path, "",
                     std::string(err == ENOENT ? "an existing file" : "a readable file") +
                         ", cannot open it: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) {
    throw InputError(path, "",
                     std::string("a readable file, fstat failed: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw InputError(path, "", "a regular file, this is not one");

  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ == 0) return m;
  void* p = ::mmap(nullptr, static_cast<size_t>(m.size_), PROT_READ, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) {
    throw InputError(path, "",
                     "a file that can be memory-mapped (" + std::to_string(m.size_) +
                         " bytes), mmap failed: " + std::strerror(errno));
  }
  m.data_ = static_cast<const uint8_t*>(p);
  // Advice only tunes paging; a kernel that ignores it reads the same bytes.
  ::madvise(p, static_cast<size_t>(m.size_), advice_of(access));
  return m;
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
    data_ = nullptr;
    size_ = 0;
  }
}

}  // namespace strata
