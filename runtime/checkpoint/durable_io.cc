// durable_io.cc — writes that survive a crash once they return: each file fsync'ed, and the
// directory fsync'ed after a rename (checkpoint_internal.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "runtime/checkpoint/checkpoint_internal.h"

namespace strata::checkpoint_internal {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

void write_chunks_synced(const std::string& path, const std::vector<Chunk>& chunks, size_t* bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot create", path);
  for (const Chunk& c : chunks) {
    size_t done = 0;
    while (done < c.size) {
      const ssize_t n = ::write(fd, c.data + done, c.size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        io_fail("cannot write", path);
      }
      done += static_cast<size_t>(n);
    }
    *bytes += c.size;
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_fail("cannot fsync", path);
  }
  if (::close(fd) != 0) io_fail("cannot close", path);
}

void write_file_synced(const std::string& path, const std::string& bytes) {
  size_t n = 0;
  write_chunks_synced(path, {{bytes.data(), bytes.size()}}, &n);
}

void fsync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open directory", path);
  ::fsync(fd);  // some filesystems refuse fsync on directories; the rename is still atomic
  ::close(fd);
}

}  // namespace strata::checkpoint_internal
