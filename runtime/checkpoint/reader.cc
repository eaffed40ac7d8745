// reader.cc — CheckpointReader (load.h): a checkpoint opened for one rank to read only what it
// holds, every data block checked against its CRC-32 as it is read, at most kMaxOpenFiles rank
// files open with one cached block each (the least recently used closed first).
//
// Thread-safety: one reader per thread (the cache is unguarded).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "runtime/checkpoint/checkpoint_internal.h"

namespace strata {
using namespace checkpoint_internal;

// At most this many rank files open at once (each with one cached block).
constexpr int kMaxOpenFiles = 8;

struct CheckpointReader::File {
  ShardHeader h;
  int fd = -1;
  std::vector<char> block;  // data block block_index, checked
  int64_t block_index = -1;
  uint64_t last_use = 0;
};

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  const Manifest m = read_manifest(path);
  format_ = m.format;
  run_state_ = read_run_state(path, m);
  std::vector<ShardHeader> headers = read_shard_headers(path, m);
  for (ShardHeader& h : headers) {
    bytes_read_ += static_cast<int64_t>(h.head.size());
    if (format_ < 2) {
      // Only the whole file's CRC-32 covers a format 1 header: check it all before believing it.
      check_shard_data(h, /*keep=*/false);
      bytes_read_ += h.data_bytes;
    }
  }
  check_coverage(path, headers);
  for (size_t r = 0; r < headers.size(); ++r) {
    const ShardHeader& h = headers[r];
    for (size_t i = 0; i < h.shard.pieces.size(); ++i) {
      const ShardPiece& sp = h.shard.pieces[i];
      pieces_[sp.kind + ":" + sp.name].push_back(
          {static_cast<int>(r), sp.kind, sp.name, sp.local_begin, h.counts[i], h.offsets[i]});
    }
    files_.push_back(std::make_unique<File>());
    files_.back()->h = std::move(headers[r]);
  }
}

CheckpointReader::~CheckpointReader() {
  for (const auto& f : files_)
    if (f->fd >= 0) ::close(f->fd);
}

const ShardMeta* CheckpointReader::meta(int rank, const std::string& name) const {
  if (rank < 0 || rank >= static_cast<int>(files_.size())) return nullptr;
  const auto& metas = files_[static_cast<size_t>(rank)]->h.shard.meta;
  const auto it = metas.find(name);
  return it == metas.end() ? nullptr : &it->second;
}

const std::vector<PieceLocation>& CheckpointReader::pieces(const std::string& kind,
                                                           const std::string& name) const {
  static const std::vector<PieceLocation> none;
  const auto it = pieces_.find(kind + ":" + name);
  return it == pieces_.end() ? none : it->second;
}

bool CheckpointReader::has(const std::string& kind) const {
  const auto it = pieces_.lower_bound(kind + ":");
  return it != pieces_.end() && it->first.compare(0, kind.size() + 1, kind + ":") == 0;
}

std::vector<std::string> CheckpointReader::names(const std::string& kind) const {
  std::vector<std::string> v;
  const std::string prefix = kind + ":";
  for (auto it = pieces_.lower_bound(prefix);
       it != pieces_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    v.push_back(it->first.substr(prefix.size()));
  return v;
}

CheckpointReader::File& CheckpointReader::open(int rank) {
  File& f = *files_[static_cast<size_t>(rank)];
  f.last_use = ++uses_;
  if (f.fd >= 0) return f;
  File* oldest = nullptr;
  int open_files = 0;
  for (const auto& g : files_) {
    if (g->fd < 0) continue;
    ++open_files;
    if (!oldest || g->last_use < oldest->last_use) oldest = g.get();
  }
  if (open_files >= kMaxOpenFiles) {
    ::close(oldest->fd);
    oldest->fd = -1;
    oldest->block_index = -1;
    std::vector<char>().swap(oldest->block);
  }
  f.fd = open_for_reading(f.h.file);
  return f;
}

const std::vector<char>& CheckpointReader::block(File& f, int64_t index) {
  if (f.block_index == index) return f.block;
  const int64_t at = index * f.h.block_bytes;
  const int64_t n = std::min(f.h.block_bytes, f.h.data_bytes - at);
  f.block_index = -1;
  f.block.resize(static_cast<size_t>(n));
  pread_exact(f.fd, f.h.file, f.h.data_start + at, n, f.block.data());
  bytes_read_ += n;
  check_block(f.h, index, crc32_ieee(f.block.data(), f.block.size()));
  f.block_index = index;
  return f.block;
}

void CheckpointReader::read(const PieceLocation& piece, int64_t first, int64_t n, float* out) {
  if (first < 0 || n < 0 || first + n > piece.count)
    throw std::logic_error("CheckpointReader::read: elements outside the piece");
  if (n == 0) return;
  File& f = open(piece.rank);
  const int64_t sz = static_cast<int64_t>(sizeof(float));
  const int64_t begin = piece.data_offset + first * sz, end = begin + n * sz;
  char* dst = reinterpret_cast<char*>(out);
  if (format_ < 2) {  // checked whole when the reader opened
    pread_exact(f.fd, f.h.file, f.h.data_start + begin, end - begin, dst);
    bytes_read_ += end - begin;
    return;
  }
  const int64_t bb = f.h.block_bytes;
  for (int64_t k = begin / bb; k * bb < end; ++k) {
    const std::vector<char>& b = block(f, k);
    const int64_t from = std::max(begin, k * bb);
    const int64_t to = std::min(end, k * bb + static_cast<int64_t>(b.size()));
    std::memcpy(dst + (from - begin), b.data() + (from - k * bb), static_cast<size_t>(to - from));
  }
}

}  // namespace strata
