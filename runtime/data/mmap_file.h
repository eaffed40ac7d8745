// mmap_file.h — a read-only memory-mapped file.
//
// The token formats (indexed.h, token_shards.h) map their files instead of reading them, so a
// corpus of any size costs host memory only for the pages actually touched, and those pages
// are the kernel's page cache, shared between the ranks of a node that open the same file.
//
// An empty file is valid: it maps nothing, data() is null and size() is 0 (mmap(2) refuses a
// zero length). A MappedFile owns its mapping: it moves, it does not copy; the mapping is
// released by the destructor.
//
// A file truncated or rewritten under a mapping makes a read of a lost page raise SIGBUS: a
// handler (installed with the first mapping) names the file and ends the process with status 1,
// rather than the signal ending it without a word.
//
// Thread-safety: the bytes are read-only, so any number of threads may read them at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

class MappedFile {
 public:
  // How the mapping will be read, passed to madvise(2): kRandom turns read-ahead off (sampling
  // documents at random from a large .bin), kSequential doubles it (scanning an index once),
  // kWillNeed starts reading the whole file in now (small index files read at open).
  enum class Access { kNormal, kRandom, kSequential, kWillNeed };

  // Maps `path` read-only. Throws InputError naming the file when it is missing, not a regular
  // file, or cannot be opened or mapped.
  static MappedFile open(const std::string& path, Access access = Access::kNormal);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();

  std::string path_;
  const uint8_t* data_ = nullptr;  // (size_) bytes, null when empty
  uint64_t size_ = 0;
  int slot_ = -1;  // its entry in the table the SIGBUS handler reads (mmap_file.cc)
};

}  // namespace strata
