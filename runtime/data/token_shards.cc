// token_shards.cc — llm.c token shards: the mapped multi-shard corpus and the writer.
#include "runtime/data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/binary_io.h"
#include "runtime/data/mmap_file.h"

namespace strata {
namespace {

using binary_io::byte_at;
using binary_io::load;

constexpr uint64_t kHeaderBytes = 256 * 4;

struct Kind {
  int32_t magic, version;
  int token_bytes;
  const char* name;
};
constexpr Kind kGpt2{20240520, 1, 2, "uint16"};
constexpr Kind kLlama3{20240801, 7, 4, "uint32"};

struct Shard {
  MappedFile file;
  int64_t tokens = 0;
  int64_t first_document = 0;  // index of its first chunk in the corpus
};

// Maps one shard and checks its header against its size.
Shard open_shard(const std::string& path, int* token_bytes) {
  Shard s;
  s.file = MappedFile::open(path, MappedFile::Access::kNormal);
  const uint64_t size = s.file.size();
  const uint8_t* h = s.file.data();
  if (size < kHeaderBytes) {
    throw InputError(path, byte_at(size),
                     "a header of 256 int32 (1024 bytes, llm.c token shard), the file ends "
                     "after " +
                         std::to_string(size) + " bytes");
  }
  const int32_t magic = load<int32_t>(h);
  const Kind* kind = magic == kGpt2.magic ? &kGpt2 : magic == kLlama3.magic ? &kLlama3 : nullptr;
  if (kind == nullptr) {
    throw InputError(path, byte_at(0),
                     "magic 20240520 (llm.c GPT-2 shard, uint16) or 20240801 (Llama 3 shard, "
                     "uint32), found " +
                         std::to_string(magic));
  }
  const int32_t version = load<int32_t>(h + 4);
  if (version != kind->version) {
    throw InputError(path, byte_at(4),
                     "version " + std::to_string(kind->version) + " (magic " +
                         std::to_string(kind->magic) + ", " + kind->name + " tokens), found " +
                         std::to_string(version));
  }
  const int32_t count = load<int32_t>(h + 8);
  if (count < 0) {
    throw InputError(path, byte_at(8),
                     "a non-negative token count, found " + std::to_string(count));
  }
  const uint64_t expected =
      kHeaderBytes + static_cast<uint64_t>(count) * static_cast<uint64_t>(kind->token_bytes);
  if (size < expected) {
    throw InputError(path, byte_at(size),
                     std::to_string(expected) + " bytes (header + " + std::to_string(count) + " " +
                         kind->name + " tokens), the file ends here, " +
                         std::to_string(expected - size) + " bytes short");
  }
  if (size > expected) {
    throw InputError(path, byte_at(expected),
                     "the end of the file after the " + std::to_string(count) +
                         " tokens the header announces, found " + std::to_string(size - expected) +
                         " more bytes");
  }
  s.tokens = count;
  *token_bytes = kind->token_bytes;
  return s;
}

std::vector<std::string> expand(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t g;
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH) {
    throw InputError(pattern, "", "at least one file matching the pattern, none does");
  }
  if (rc != 0) {
    throw InputError(pattern, "",
                     "a readable pattern, glob(3) failed with code " + std::to_string(rc));
  }
  // glob(3) sorts by the locale's collation; byte order is the same everywhere.
  std::sort(paths.begin(), paths.end());
  return paths;
}

// The kernel's limit on one process's memory mappings (/proc/sys/vm/max_map_count), or Linux's
// default where it cannot be read. STRATA_TEST_MAX_MAP_COUNT (a test hook) stands in for it.
int64_t max_mappings() {
  if (const char* t = std::getenv("STRATA_TEST_MAX_MAP_COUNT")) return std::atoll(t);
  std::ifstream f("/proc/sys/vm/max_map_count");
  int64_t n = 0;
  return (f >> n) && n > 0 ? n : 65530;
}

class ShardCorpus final : public TokenCorpus {
 public:
  ShardCorpus(const std::string& pattern, int64_t document_tokens)
      : pattern_(pattern), chunk_(document_tokens) {
    const std::vector<std::string> paths = expand(pattern);
    // Every shard is memory-mapped for the run: more than half the kernel's limit on a process's
    // mappings (vm.max_map_count) would fail part-way with "Cannot allocate memory", or leave
    // the rest of the process (its libraries, allocator, MPI) none.
    const int64_t limit = max_mappings() / 2;
    if (static_cast<int64_t>(paths.size()) > limit)
      throw InputError(pattern, "",
                       "at most " + std::to_string(limit) +
                           " shards (each is memory-mapped, and vm.max_map_count allows " +
                           std::to_string(max_mappings()) + " mappings a process), found " +
                           std::to_string(paths.size()) +
                           ": merge them into fewer, larger shards (data prepare --shard-tokens)");
    for (const std::string& path : paths) {
      int width = 0;
      Shard s = open_shard(path, &width);
      if (!shards_.empty() && width != token_bytes_) {
        throw InputError(path, byte_at(0),
                         "a shard of " + std::to_string(token_bytes_) + "-byte tokens like " +
                             shards_.front().file.path() +
                             " (one corpus has one token size), found " + std::to_string(width) +
                             "-byte tokens");
      }
      token_bytes_ = width;
      s.first_document = documents_;
      documents_ += (s.tokens + chunk_ - 1) / chunk_;
      tokens_ += s.tokens;
      shards_.push_back(std::move(s));
    }
    if (tokens_ == 0) {
      throw InputError(
          pattern, "",
          "at least one token, the " + std::to_string(shards_.size()) + " shard(s) hold none");
    }
  }

  std::string path() const override { return pattern_; }
  int64_t num_documents() const override { return documents_; }
  int64_t document_length(int64_t d) const override {
    const Shard& s = shard_of(d);
    const int64_t begin = (d - s.first_document) * chunk_;
    return std::min(chunk_, s.tokens - begin);
  }
  int64_t num_tokens() const override { return tokens_; }
  int token_bytes() const override { return token_bytes_; }

  void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const override {
    const int64_t len = document_length(d);
    if (offset < 0 || count < 0 || offset > len || count > len - offset) {
      throw std::out_of_range(pattern_ + ": tokens [" + std::to_string(offset) + ", " +
                              std::to_string(offset + count) + ") of document " +
                              std::to_string(d) + " of " + std::to_string(len) + " tokens");
    }
    const Shard& s = shard_of(d);
    const uint64_t byte = byte_of(s, d, offset);
    const uint8_t* src = s.file.data() + byte;
    if (token_bytes_ == 2) {
      binary_io::widen<uint16_t>(src, count, out);
      return;
    }
    const int64_t fit = binary_io::widen<uint32_t>(src, count, out);
    if (fit != count) {
      const uint64_t bad = byte + 4 * static_cast<uint64_t>(fit);
      throw InputError(s.file.path(), byte_at(bad),
                       "a token id that fits int32, found " +
                           std::to_string(load<uint32_t>(s.file.data() + bad)));
    }
  }

  std::string locate(int64_t d, int64_t offset) const override {
    if (offset < 0 || offset >= document_length(d)) {
      throw std::out_of_range(pattern_ + ": token " + std::to_string(offset) + " of document " +
                              std::to_string(d));
    }
    const Shard& s = shard_of(d);
    return s.file.path() + ": " + byte_at(byte_of(s, d, offset));
  }

 private:
  const Shard& shard_of(int64_t d) const {
    if (d < 0 || d >= documents_) {
      throw std::out_of_range(pattern_ + ": document " + std::to_string(d) + " of " +
                              std::to_string(documents_));
    }
    // The last shard whose first document is at or before d (empty shards own no document
    // and are skipped by taking the last).
    auto it = std::upper_bound(shards_.begin(), shards_.end(), d,
                               [](int64_t x, const Shard& s) { return x < s.first_document; });
    return *(it - 1);
  }
  uint64_t byte_of(const Shard& s, int64_t d, int64_t offset) const {
    const int64_t token = (d - s.first_document) * chunk_ + offset;
    return kHeaderBytes + static_cast<uint64_t>(token) * static_cast<uint64_t>(token_bytes_);
  }

  std::string pattern_;
  int64_t chunk_;
  std::vector<Shard> shards_;  // [shard] in path order
  int64_t documents_ = 0, tokens_ = 0;
  int token_bytes_ = 0;
};

}  // namespace

std::unique_ptr<TokenCorpus> open_token_shards(const std::string& pattern,
                                               int64_t document_tokens) {
  if (document_tokens < 1) {
    throw std::invalid_argument("open_token_shards: document_tokens must be >= 1, got " +
                                std::to_string(document_tokens));
  }
  return std::make_unique<ShardCorpus>(pattern, document_tokens);
}

void write_token_shard(const std::string& path, const int32_t* tokens, int64_t n, int token_bytes) {
  write_token_shard_unpublished(path, tokens, n, token_bytes)->rename();
}

std::unique_ptr<binary_io::AtomicFile> write_token_shard_unpublished(const std::string& path,
                                                                     const int32_t* tokens,
                                                                     int64_t n, int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) {
    throw std::invalid_argument(
        "write_token_shard: token_bytes must be 2 (uint16) or 4 "
        "(uint32), got " +
        std::to_string(token_bytes));
  }
  if (n < 0 || n > INT32_MAX) {
    throw std::invalid_argument("write_token_shard: a shard holds 0.." + std::to_string(INT32_MAX) +
                                " tokens (an int32 count), got " + std::to_string(n));
  }
  const Kind& kind = token_bytes == 2 ? kGpt2 : kLlama3;
  const int64_t max = token_bytes == 2 ? 65535 : INT32_MAX;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] > max) {
      throw std::invalid_argument("write_token_shard: token " + std::to_string(i) + " is " +
                                  std::to_string(tokens[i]) + ", outside " + kind.name +
                                  (token_bytes == 2 ? " [0, 65535]" : " [0, 2^31)"));
    }
  }
  int32_t header[256] = {};
  header[0] = kind.magic;
  header[1] = kind.version;
  header[2] = static_cast<int32_t>(n);
  auto f = std::make_unique<binary_io::AtomicFile>(path);
  f->write(header, sizeof header);
  if (token_bytes == 4) {
    f->write(tokens, 4 * static_cast<uint64_t>(n));  // non-negative int32 = the same uint32
  } else {
    std::vector<uint16_t> buf;
    constexpr int64_t kBlock = int64_t{1} << 16;
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      buf.assign(tokens + i, tokens + i + m);
      f->write(buf.data(), 2 * static_cast<uint64_t>(m));
    }
  }
  f->close();
  return f;
}

}  // namespace strata
