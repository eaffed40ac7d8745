// input_file.cc — check_input_file / read_input_file over POSIX open/fstat/read.
#include "runtime/io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/base/error.h"
#include "runtime/memory/allocator.h"

namespace strata {
namespace {

// What a file that is not the kind expected is instead.
std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

std::string limit_text(uint64_t max_bytes) {
  return "a file of at most " + format_bytes(static_cast<int64_t>(max_bytes));
}

// The checks on a stat result: a regular file within the limit.
void check_stat(const std::string& path, const struct stat& st, uint64_t max_bytes) {
  if (!S_ISREG(st.st_mode))
    throw InputError(path, "", "expected a regular file, got " + kind_of(st.st_mode));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw InputError(path, "",
                     "expected " + limit_text(max_bytes) + ", got " +
                         format_bytes(static_cast<int64_t>(size)) + " (" + std::to_string(size) +
                         " bytes)");
  }
}

[[noreturn]] void open_failed(const std::string& path, int err) {
  throw InputError(
      path, "",
      std::string(err == ENOENT ? "expected an existing file" : "expected a readable file") +
          ", cannot open it: " + std::strerror(err));
}

// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

template <class Bytes>
Bytes read_all(const std::string& path, uint64_t max_bytes) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) open_failed(path, errno);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) open_failed(path, errno);
  check_stat(path, st, max_bytes);
  const size_t size = static_cast<size_t>(st.st_size);
  // The stat size and one byte more, which must find the end: a file that holds more than its
  // size says is not read on (a /proc file says 0 and has no fixed content).
  Bytes out;
  out.resize(size + 1);
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(f.fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw InputError(
          path, "byte " + std::to_string(got),
          std::string("expected a readable file, the read failed: ") + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != size) {
    throw InputError(path, "byte " + std::to_string(std::min(got, size)),
                     "expected the " + std::to_string(size) + " bytes its size says, got " +
                         (got < size ? "fewer" : "more") +
                         " (a file that changed while read, or a /proc or /sys file)");
  }
  out.resize(size);
  return out;
}

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Whether `path` lies on a kernel file system (/proc, /sys): its files are not storage, a write
// to them is a request to the kernel (and fails, or worse, later).
bool on_kernel_fs(const std::string& path) {
  constexpr long kProc = 0x9fa0, kSysfs = 0x62656572;  // PROC_SUPER_MAGIC, SYSFS_MAGIC
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return false;
  return static_cast<long>(fs.f_type) == kProc || static_cast<long>(fs.f_type) == kSysfs;
}

}  // namespace

std::string output_file_problem(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    // A character device is a fine sink (/dev/null, /dev/stdout; /dev/full's failed writes are
    // reported as they happen); a directory, a FIFO or a socket is not.
    if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) return kind_of(st.st_mode);
    if (S_ISREG(st.st_mode) && on_kernel_fs(path)) return "a /proc or /sys file, not storage";
    // O_APPEND without O_TRUNC: the probe leaves the content as it was.
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno_text("not writable");
    ::close(fd);
    return "";
  }
  if (errno != ENOENT) return errno_text("cannot inspect it");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return errno_text("cannot create it");
  ::close(fd);
  ::unlink(path.c_str());
  return "";
}

std::string output_directory_problem(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return "cannot create it: " + (ec ? ec.message() : std::string(std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return kind_of(st.st_mode);
  std::string probe = path + "/.strata-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return errno_text("cannot create files in it");
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

uint64_t check_input_file(const std::string& path, uint64_t max_bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) open_failed(path, errno);
  check_stat(path, st, max_bytes);
  return static_cast<uint64_t>(st.st_size);
}

std::string read_input_file(const std::string& path, uint64_t max_bytes) {
  return read_all<std::string>(path, max_bytes);
}

std::vector<uint8_t> read_input_bytes(const std::string& path, uint64_t max_bytes) {
  return read_all<std::vector<uint8_t>>(path, max_bytes);
}

}  // namespace strata
