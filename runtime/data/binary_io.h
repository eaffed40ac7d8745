// binary_io.h — pieces shared by the token formats (indexed.h, token_shards.h): little-endian
// loads from mapped bytes, the "byte N" of error messages, token widening, and a file written
// atomically (a temporary beside it, renamed into place once complete).
//
// Both formats are little-endian on disk and Strata reads tokens in place from the mapping, so
// only little-endian hosts are supported (every platform Strata builds for).
//
// Thread-safety: the functions are pure; an AtomicFile belongs to one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the token formats are little-endian and read in place");

namespace strata {
namespace binary_io {

// The value of type T stored at p, which need not be aligned (index fields follow a 34-byte
// header).
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// "byte N", the where of an InputError about a file.
inline std::string byte_at(uint64_t offset) {
  return "byte " + std::to_string(offset);
}

// Copies n tokens of type T from src (aligned for T) into out as int32. Returns the index of
// the first token that does not fit int32 (only possible for int64 and uint32), or n when all fit;
// tokens from there on are not written.
template <typename T>
int64_t widen(const uint8_t* src, int64_t n, int32_t* out) {
  const T* t = reinterpret_cast<const T*>(src);
  if constexpr (sizeof(T) < sizeof(int32_t) ||
                (sizeof(T) == sizeof(int32_t) && static_cast<T>(-1) < 0)) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(t[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      // uint32 converts exactly; int64 needs no conversion.
      const int64_t v = static_cast<int64_t>(t[i]);
      if (v < INT32_MIN || v > INT32_MAX) return i;
      out[i] = static_cast<int32_t>(v);
    }
  }
  return n;
}

// A file written under a temporary name (PATH.tmp.PID) and renamed to PATH by commit(), so a
// reader never sees it half-written. Destroyed without commit(), it removes the temporary and
// leaves any existing PATH untouched. Write errors throw InputError naming PATH.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, uint64_t n);
  uint64_t size() const { return size_; }
  // Flushes, syncs and closes the temporary. rename() is separate so that several files can
  // be completed first and then put in place together.
  void close();
  // Renames the closed temporary to the final path.
  void rename();
  // InputError naming the final path when a rename could not put the file there (it is a
  // directory): checked for every file of a set before any of them is renamed.
  void check_destination() const;

  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint64_t size_ = 0;
  bool renamed_ = false;
};

}  // namespace binary_io
}  // namespace strata
