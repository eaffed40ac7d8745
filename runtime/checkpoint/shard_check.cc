// shard_check.cc — the shard files of a checkpoint checked (load.h): each header against
// metadata.json and its own rules, the data against the file's and the blocks' CRC-32s, the
// tensors' coverage across the files; and the whole-checkpoint reads built on them
// (verify_checkpoint, select_checkpoint, read_checkpoint).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/io/safetensors.h"

namespace strata {
namespace checkpoint_internal {
namespace {

// A shape from JSON: sizes ≥ 0 whose product fits in int64.
std::vector<int64_t> shape_field(const json& obj, const std::string& key, const std::string& file,
                                 const std::string& where) {
  const json& v = field(obj, key, file, where + ".");
  if (!v.is_array() || v.empty() || v.size() > 8)
    throw InputError(file, where + "." + key, "expected an array of 1 to 8 sizes, got " + show(v));
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (size_t i = 0; i < v.size(); ++i) {
    shape.push_back(
        int_in(v[i], 0, INT64_MAX, file, where + "." + key + "[" + std::to_string(i) + "]"));
    if (__builtin_mul_overflow(numel, shape.back(), &numel))
      throw InputError(file, where + "." + key,
                       "sizes whose product fits in 64 bits, got " + show(v));
  }
  return shape;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

void pread_exact(int fd, const std::string& file, int64_t offset, int64_t n, char* out) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, static_cast<size_t>(n - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw InputError(file, "byte " + std::to_string(offset + done),
                       std::to_string(n - done) + " more readable bytes (truncated while read?)");
    done += got;
  }
}

int open_for_reading(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw InputError(
        file, "", std::string("a readable file (metadata.json lists it): ") + std::strerror(errno));
  return fd;
}

namespace {

// The whole file through the CRC-32, streamed (memory: one chunk).
uint32_t file_crc(const std::string& file, int64_t size) {
  const int fd = open_for_reading(file);
  FdCloser closer{fd};
  std::vector<char> chunk(std::min<size_t>(kStreamChunk, static_cast<size_t>(size)));
  uint32_t crc = 0;
  for (int64_t at = 0; at < size;) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), size - at);
    pread_exact(fd, file, at, n, chunk.data());
    crc = crc32_ieee(chunk.data(), static_cast<size_t>(n), crc);
    at += n;
  }
  return crc;
}

// The header of a shard file, checked: its bytes against metadata.json's header CRC-32 (format
// 2; format 1 records only the whole file's, which check_shard_data compares), every tensor an
// F32 vector named param:<name>, param_prev:<name>, m:<name>:<first element> or v:…, inside its
// parameter's shard, which a "meta:<name>" entry places in the full tensor; format 2 also the
// data's block CRC-32s.
ShardHeader read_shard_header(const std::string& file, const FileRecord& rec, int format) {
  check_size(file, rec);
  ShardHeader h;
  h.file = file;
  h.rec = rec;
  h.format = format;
  if (format >= 2) {
    const int fd = open_for_reading(file);
    FdCloser closer{fd};
    h.head.resize(static_cast<size_t>(rec.header_bytes));
    pread_exact(fd, file, 0, rec.header_bytes, h.head.data());
    const uint32_t crc = crc32_ieee(h.head.data(), h.head.size());
    if (crc_hex(crc) != rec.header_crc32)
      throw InputError(file, "byte 0",
                       "a header of CRC-32 " + rec.header_crc32 +
                           " as metadata.json records, found " + crc_hex(crc) + " (corrupted)");
  }
  std::optional<StReader> reader;
  try {
    reader.emplace(file);
  } catch (const InputError&) {
    // A format 1 header that does not parse is corrupt when the file is not the recorded one.
    if (format < 2) check_crc(file, rec, file_crc(file, rec.bytes));
    throw;
  }
  StReader& r = *reader;
  h.data_start = r.data_start();
  h.data_bytes = rec.bytes - h.data_start;
  if (format >= 2 && h.data_start != rec.header_bytes)
    throw InputError(file, "byte 0",
                     "a header of " + std::to_string(rec.header_bytes) +
                         " bytes as metadata.json records, found " + std::to_string(h.data_start));
  if (format < 2) {
    const int fd = open_for_reading(file);
    FdCloser closer{fd};
    h.head.resize(static_cast<size_t>(h.data_start));
    pread_exact(fd, file, 0, h.data_start, h.head.data());
  }
  // The tensors tile the data section (StReader checked it): in offset order their bytes are
  // the rest of the file.
  std::vector<const std::pair<const std::string, StEntry>*> order;
  for (const auto& e : r.entries()) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::make_pair(a->second.begin, a->second.end) <
           std::make_pair(b->second.begin, b->second.end);
  });

  RankShard& s = h.shard;
  for (const auto& [key, value] : r.metadata()) {
    if (key.rfind("meta:", 0) != 0) continue;
    const std::string where = "__metadata__." + key;
    json j;
    try {
      j = json::parse(value);
    } catch (const json::exception&) {
      throw InputError(file, where,
                       "a JSON object (full_shape, shard_shape, split, tp_rank, tp[, expert_rank, "
                       "expert])");
    }
    const bool expert_split = j.is_object() && (j.contains("expert") || j.contains("expert_rank"));
    if (expert_split)
      exact_object(j,
                   {"full_shape", "shard_shape", "split", "tp_rank", "tp", "expert_rank", "expert"},
                   file, where);
    else
      exact_object(j, {"full_shape", "shard_shape", "split", "tp_rank", "tp"}, file, where);
    ShardMeta m;
    m.full_shape = shape_field(j, "full_shape", file, where);
    m.shard_shape = shape_field(j, "shard_shape", file, where);
    m.split = string_field(j, "split", file, where + ".");
    m.tp = static_cast<int>(int_field(j, "tp", 1, 1 << 20, file, where + "."));
    m.tp_rank = static_cast<int>(int_field(j, "tp_rank", 0, m.tp - 1, file, where + "."));
    if (expert_split) {
      m.expert = static_cast<int>(int_field(j, "expert", 2, 1 << 20, file, where + "."));
      m.expert_rank =
          static_cast<int>(int_field(j, "expert_rank", 0, m.expert - 1, file, where + "."));
    }
    // A shard is 1/(tp·expert) of the full tensor (a replicated parameter is written with tp 1),
    // its rows a whole number of expert runs.
    const int64_t parts = static_cast<int64_t>(m.tp) * m.expert;
    if (m.full_shape.size() != m.shard_shape.size() ||
        numel_of(m.full_shape) / parts != numel_of(m.shard_shape) ||
        numel_of(m.full_shape) % parts != 0 ||
        (m.expert > 1 && (m.full_shape.empty() || m.full_shape[0] % m.expert != 0)))
      throw InputError(file, where,
                       "a shard_shape with full_shape's number of dimensions and 1/" +
                           std::to_string(parts) + " of its elements (tp " + std::to_string(m.tp) +
                           ", expert " + std::to_string(m.expert) + "), got full_shape " +
                           show(j.at("full_shape")) + ", shard_shape " + show(j.at("shard_shape")));
    s.meta[key.substr(5)] = m;
  }
  if (format >= 2) {
    const auto bb = r.metadata().find("crc32_block_bytes");
    const auto bc = r.metadata().find("crc32_blocks");
    if (bb == r.metadata().end() || bc == r.metadata().end())
      throw InputError(file, "__metadata__.crc32_blocks",
                       "the data's block CRC-32s (crc32_block_bytes, crc32_blocks) of a "
                       "strata-checkpoint-2 shard, found none");
    const std::string& digits = bb->second;
    if (digits.empty() || digits.size() > 12 ||
        digits.find_first_not_of("0123456789") != std::string::npos || std::stoll(digits) < 1)
      throw InputError(file, "__metadata__.crc32_block_bytes",
                       "a positive byte count, got \"" + digits + "\"");
    h.block_bytes = std::stoll(digits);
    const int64_t blocks = (h.data_bytes + h.block_bytes - 1) / h.block_bytes;
    const std::string& hex = bc->second;
    if (static_cast<int64_t>(hex.size()) != 8 * blocks ||
        hex.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw InputError(file, "__metadata__.crc32_blocks",
                       std::to_string(blocks) + " CRC-32s of 8 lowercase hexadecimal digits (" +
                           std::to_string(h.data_bytes) + " data bytes in blocks of " + digits +
                           "), got " + std::to_string(hex.size()) + " characters");
    for (int64_t b = 0; b < blocks; ++b)
      h.block_crcs.push_back(static_cast<uint32_t>(
          std::stoul(hex.substr(static_cast<size_t>(8 * b), 8), nullptr, 16)));
  }
  for (const auto* e : order) {
    const std::string& key = e->first;
    const StEntry& t = e->second;
    const std::string where = "tensor " + key;
    if (t.dtype != "F32" || t.shape.size() != 1)
      throw InputError(file, where,
                       "an F32 vector, got dtype " + t.dtype + " of " +
                           std::to_string(t.shape.size()) + " dimension(s)");
    ShardPiece p;
    const size_t c1 = key.find(':');
    p.kind = c1 == std::string::npos ? "" : key.substr(0, c1);
    if (p.kind == "param" || p.kind == "param_prev") {
      p.name = key.substr(c1 + 1);
    } else {
      const size_t c2 = key.rfind(':');
      const std::string first = c2 == std::string::npos ? "" : key.substr(c2 + 1);
      if ((p.kind != "m" && p.kind != "v") || c2 == c1 || first.empty() || first.size() > 18 ||
          first.find_first_not_of("0123456789") != std::string::npos)
        throw InputError(file, where,
                         "param:<name>, param_prev:<name>, m:<name>:<first element> or v:…");
      p.name = key.substr(c1 + 1, c2 - c1 - 1);
      p.local_begin = std::stoll(first);
    }
    const auto m = s.meta.find(p.name);
    if (m == s.meta.end()) throw InputError(file, where, "a meta:" + p.name + " entry");
    const int64_t shard = numel_of(m->second.shard_shape);
    if (p.local_begin > shard || t.shape[0] > shard - p.local_begin)
      throw InputError(file, where,
                       "elements inside the " + std::to_string(shard) + " of its shard, got [" +
                           std::to_string(p.local_begin) + ", " +
                           std::to_string(p.local_begin + t.shape[0]) + ")");
    h.offsets.push_back(t.begin);
    h.counts.push_back(t.shape[0]);
    s.pieces.push_back(std::move(p));
  }
  return h;
}

}  // namespace

void check_block(const ShardHeader& h, int64_t block, uint32_t crc) {
  const uint32_t want = h.block_crcs[static_cast<size_t>(block)];
  if (crc != want)
    throw InputError(h.file, "byte " + std::to_string(h.data_start + block * h.block_bytes),
                     "a data block of CRC-32 " + crc_hex(want) + " as the header records, found " +
                         crc_hex(crc) + " (corrupted)");
}

void check_shard_data(ShardHeader& h, bool keep) {
  const int fd = open_for_reading(h.file);
  FdCloser closer{fd};
  uint32_t crc = crc32_ieee(h.head.data(), h.head.size());
  BlockCrcs blocks(h.block_bytes);
  std::vector<char> chunk;
  for (size_t i = 0; i < h.shard.pieces.size(); ++i) {
    ShardPiece& p = h.shard.pieces[i];
    const int64_t bytes = h.counts[i] * static_cast<int64_t>(sizeof(float));
    if (keep) p.values.resize(static_cast<size_t>(h.counts[i]));
    for (int64_t at = 0; at < bytes;) {
      const int64_t n = std::min<int64_t>(kStreamChunk, bytes - at);
      char* out;
      if (keep) {
        out = reinterpret_cast<char*>(p.values.data()) + at;
      } else {
        chunk.resize(static_cast<size_t>(n));
        out = chunk.data();
      }
      pread_exact(fd, h.file, h.data_start + h.offsets[i] + at, n, out);
      if (h.format >= 2)
        blocks.add(out, static_cast<size_t>(n));  // the file's CRC-32 combines the blocks'
      else
        crc = crc32_ieee(out, static_cast<size_t>(n), crc);
      at += n;
    }
  }
  if (h.format >= 2) {
    uint32_t data_crc = 0;
    const std::vector<uint32_t> got = blocks.finish(&data_crc);
    if (h.data_bytes > 0) crc = crc32_concat(crc, data_crc, h.data_bytes);
    check_crc(h.file, h.rec, crc);
    for (size_t b = 0; b < got.size(); ++b) check_block(h, static_cast<int64_t>(b), got[b]);
  } else {
    check_crc(h.file, h.rec, crc);
  }
}

void check_coverage(const std::string& path, const std::vector<ShardHeader>& shards) {
  std::map<std::string, std::pair<std::vector<int64_t>, int>> full;  // [name] (shape, rank)
  std::map<std::string, int64_t> written;                            // [kind:name]
  for (size_t r = 0; r < shards.size(); ++r) {
    for (const auto& [name, m] : shards[r].shard.meta) {
      const auto [it, fresh] = full.emplace(name, std::make_pair(m.full_shape, int(r)));
      if (!fresh && it->second.first != m.full_shape)
        throw InputError(path + "/" + rank_file(int(r)), "__metadata__.meta:" + name,
                         "the full_shape " + show(json(it->second.first)) + " of " +
                             rank_file(it->second.second) + ", got " + show(json(m.full_shape)));
    }
    for (size_t i = 0; i < shards[r].shard.pieces.size(); ++i) {
      const ShardPiece& p = shards[r].shard.pieces[i];
      written[p.kind + ":" + p.name] += shards[r].counts[i];
    }
  }
  for (const auto& [key, n] : written) {
    const int64_t want = numel_of(full.at(key.substr(key.find(':') + 1)).first);
    if (n != want)
      throw InputError(path, key,
                       "every element of the full tensor once, " + std::to_string(want) +
                           " in all, got " + std::to_string(n) + " over the rank files");
  }
}

std::vector<ShardHeader> read_shard_headers(const std::string& path, const Manifest& m) {
  std::vector<ShardHeader> shards;
  for (int r = 0; r < m.world_size; ++r)
    shards.push_back(
        read_shard_header(path + "/" + rank_file(r), m.files.at(rank_file(r)), m.format));
  return shards;
}

namespace {

// Reads (keep_values) or only checks a checkpoint: metadata.json, then each file against it.
LoadedCheckpoint read_checked(const std::string& path, bool keep_values) {
  LoadedCheckpoint c;
  c.path = path;
  const Manifest m = read_manifest(path);
  c.run_state = read_run_state(path, m);
  c.tokenizer = checked_tokenizer(path, m);
  std::vector<ShardHeader> shards = read_shard_headers(path, m);
  for (ShardHeader& h : shards) check_shard_data(h, keep_values);
  check_coverage(path, shards);
  if (keep_values)
    for (ShardHeader& h : shards) c.shards.push_back(std::move(h.shard));
  return c;
}

}  // namespace
}  // namespace checkpoint_internal

using checkpoint_internal::final_checkpoints;
using checkpoint_internal::read_checked;

std::optional<std::string> checkpoint_tokenizer(const std::string& path) {
  return checkpoint_internal::checked_tokenizer(path, checkpoint_internal::read_manifest(path));
}

std::string checkpoint_or_newest(const std::string& path, std::ostream& err) {
  std::error_code ec;
  if (std::filesystem::exists(path + "/metadata.json", ec)) return path;
  const std::optional<std::string> newest = select_checkpoint(path, "auto", err);
  if (!newest)
    throw InputError(path, "", "a checkpoint, or a checkpoint.dir holding a valid checkpoint");
  return *newest;
}

std::string verify_checkpoint(const std::string& path) {
  try {
    read_checked(path, /*keep_values=*/false);
    return "";
  } catch (const InputError& e) {
    return e.what() + std::strlen("error: ");
  }
}

std::optional<std::string> select_checkpoint(const std::optional<std::string>& dir,
                                             const std::string& resume, std::ostream& err) {
  if (resume == "none") return std::nullopt;
  if (resume != "auto") {
    read_checked(resume, /*keep_values=*/false);  // InputError naming the file and the field
    return resume;
  }
  if (!dir) return std::nullopt;
  auto v = final_checkpoints(*dir);
  for (auto it = v.rbegin(); it != v.rend(); ++it) {
    const std::string why = verify_checkpoint(it->second.string());
    if (why.empty()) return it->second.string();
    err << "warning: skipping checkpoint " << it->second.string() << ": " << why << "\n";
  }
  return std::nullopt;
}

LoadedCheckpoint read_checkpoint(const std::string& path) {
  return read_checked(path, /*keep_values=*/true);
}

}  // namespace strata
