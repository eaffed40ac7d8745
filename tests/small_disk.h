// small_disk.h — a full disk on demand for tests: a tmpfs of a few KiB or MiB mounted at a fresh
// directory (needs root, as mount(2) does; tests skip with the reason when it fails).
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace strata {
namespace testdisk {

class SmallDisk {
 public:
  // `size`: tmpfs's size option ("1m", "16k").
  explicit SmallDisk(const std::string& size) {
    path_ = (std::filesystem::temp_directory_path() /
             ("strata_small_disk_" + std::to_string(::getpid()) + "_" + std::to_string(count_++)))
                .string();
    std::filesystem::create_directories(path_);
    const std::string opts = "size=" + size;
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0) {
      mounted_ = true;
    } else {
      why_ = "cannot mount a " + size + " tmpfs at " + path_ + ": " + std::strerror(errno) +
             " (needs root)";
    }
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_; }
  const std::string& path() const { return path_; }

 private:
  static inline int count_ = 0;
  std::string path_, why_;
  bool mounted_ = false;
};

}  // namespace testdisk
}  // namespace strata
