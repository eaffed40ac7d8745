#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "runtime/base/error.h"
#include "runtime/comm/watchdog.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"
#include "runtime/io/safetensors.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

// Format 2 checks a shard's data in blocks, so that a rank reading only its tensors' byte ranges
// checks every byte it uses: blocks of at least 1 MiB, at most 16384 per file (their CRC-32s
// sit in the shard's header, at most 128 KiB of hexadecimal).
constexpr int64_t kMinBlockBytes = int64_t{1} << 20;
constexpr int64_t kMaxBlocks = 16384;
// Reads stream through buffers of this size.
constexpr int64_t kStreamChunk = int64_t{4} << 20;

int64_t block_bytes_for(int64_t data_bytes) {
  int64_t b = kMinBlockBytes;
  while ((data_bytes + b - 1) / b > kMaxBlocks) b *= 2;
  return b;
}

// The CRC-32 of each block_bytes of a byte stream fed in order (the last block may be shorter),
// and of the whole stream, combined from the blocks' (one pass over the bytes gives both).
class BlockCrcs {
 public:
  explicit BlockCrcs(int64_t block_bytes) : block_(block_bytes) {}
  void add(const char* p, size_t n) {
    while (n > 0) {
      const size_t take = std::min(n, static_cast<size_t>(block_ - filled_));
      crc_ = crc32_ieee(p, take, crc_);
      filled_ += static_cast<int64_t>(take);
      p += take;
      n -= take;
      if (filled_ == block_) close_block();
    }
  }
  // The blocks' CRC-32s; *whole: the stream's.
  std::vector<uint32_t> finish(uint32_t* whole = nullptr) {
    if (filled_ > 0) close_block();
    if (whole) *whole = whole_;
    whole_ = 0;
    return std::move(crcs_);
  }

 private:
  void close_block() {
    whole_ = crcs_.empty() ? crc_ : crc32_concat(whole_, crc_, filled_);
    crcs_.push_back(crc_);
    crc_ = 0;
    filled_ = 0;
  }
  int64_t block_;
  int64_t filled_ = 0;
  uint32_t crc_ = 0, whole_ = 0;
  std::vector<uint32_t> crcs_;
};

struct Chunk {
  const char* data;
  size_t size;
};

// Writes the chunks to `path` in order and fsyncs it: after this returns the data survives a
// crash. Adds the file's size to *bytes.
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

// A rename is durable only once the directory holding it is synced.
void fsync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open directory", path);
  ::fsync(fd);  // some filesystems refuse fsync on directories; the rename is still atomic
  ::close(fd);
}

// A checkpoint's JSON file; "" when it is missing, unreadable, not a regular file or larger than
// any metadata (the callers report that as the file's fault).
std::string read_file(const std::string& path) {
  try {
    return read_input_file(path, kMaxJsonFileBytes);
  } catch (const InputError&) {
    return {};
  }
}

std::string crc_hex(uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", c);
  return buf;
}

// iter_<N> → N; -1 for any other name (temporaries included).
int iteration_of(const std::string& name) {
  if (name.rfind("iter_", 0) != 0 || name.size() == 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::atoi(name.c_str() + 5);
}

std::vector<std::pair<int, fs::path>> final_checkpoints(const std::string& dir) {
  std::vector<std::pair<int, fs::path>> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int n = iteration_of(e.path().filename().string());
    if (n >= 0 && e.is_directory()) v.emplace_back(n, e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

void prune(const std::string& dir, int keep, const std::string& just_written) {
  std::error_code ec;
  // Temporaries are left only by saves that died (saving is collective and ours is done).
  remove_partial_saves(dir);
  if (keep <= 0) return;
  auto v = final_checkpoints(dir);
  int kept = 0;
  for (auto it = v.rbegin(); it != v.rend(); ++it) {
    if (kept < keep || it->second.string() == just_written) {
      ++kept;
      continue;
    }
    fs::remove_all(it->second, ec);
  }
}

void kill_hook(int iteration, int rank, int world) {
  const char* s = std::getenv("STRATA_TEST_KILL_DURING_SAVE");
  if (!s || std::atoi(s) != iteration) return;
  if (rank == (world > 1 ? 1 : 0)) ::raise(SIGKILL);
}

}  // namespace

std::vector<std::string> remove_partial_saves(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool partial = name.rfind("iter_", 0) == 0 && name.find(".tmp-") != std::string::npos;
    if (!partial && name != "latest.tmp") continue;
    fs::remove_all(e.path(), ec);
    if (!ec) removed.push_back(e.path().string());
  }
  return removed;
}

uint32_t crc32_ieee(const void* data, size_t n, uint32_t crc) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

uint32_t crc32_concat(uint32_t a, uint32_t b, int64_t b_bytes) {
  return static_cast<uint32_t>(crc32_combine(a, b, static_cast<z_off_t>(b_bytes)));
}

namespace {
// The length prefix and JSON header of a shard file (the data follows, piece by piece);
// *data_crc: the CRC-32 of that data, from the same pass that checksums its blocks.
std::string shard_header(const RankShard& s, uint32_t* data_crc = nullptr) {
  nlohmann::ordered_json j;
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [name, m] : s.meta) {
    meta["meta:" + name] = nlohmann::json{
        {"full_shape", m.full_shape},
        {"shard_shape", m.shard_shape},
        {"split", m.split},
        {"tp_rank", m.tp_rank},
        {"tp", m.tp}}.dump();
  }
  // The data's block CRC-32s (format 2): computed from the pieces before a byte is written.
  int64_t data_bytes = 0;
  for (const ShardPiece& p : s.pieces)
    data_bytes += static_cast<int64_t>(p.values.size() * sizeof(float));
  const int64_t block_bytes = block_bytes_for(data_bytes);
  BlockCrcs blocks(block_bytes);
  for (const ShardPiece& p : s.pieces)
    blocks.add(reinterpret_cast<const char*>(p.values.data()), p.values.size() * sizeof(float));
  std::string hex;
  for (const uint32_t c : blocks.finish(data_crc)) hex += crc_hex(c);
  meta["crc32_block_bytes"] = std::to_string(block_bytes);
  meta["crc32_blocks"] = hex;
  j["__metadata__"] = meta;
  int64_t offset = 0;
  for (const ShardPiece& p : s.pieces) {
    const int64_t bytes = static_cast<int64_t>(p.values.size() * sizeof(float));
    const std::string key = p.kind == "param" || p.kind == "param_prev"
                                ? p.kind + ":" + p.name
                                : p.kind + ":" + p.name + ":" + std::to_string(p.local_begin);
    j[key] = {{"dtype", "F32"},
              {"shape", {static_cast<int64_t>(p.values.size())}},
              {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header;
}
}  // namespace

std::string serialize_shard(const RankShard& s) {
  std::string out = shard_header(s);
  for (const ShardPiece& p : s.pieces)
    out.append(reinterpret_cast<const char*>(p.values.data()), p.values.size() * sizeof(float));
  return out;
}

namespace {

// ---- reading: every field is checked as strictly as a config's, every byte against its CRC ----

using nlohmann::json;

std::string show(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// An integer-valued JSON number in [lo, hi] (3.0 counts, 3.5 and 1e300 do not), else
// InputError naming `file` and `key`.
int64_t int_in(const json& v, int64_t lo, int64_t hi, const std::string& file,
               const std::string& key) {
  bool ok = false;
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= static_cast<uint64_t>(hi);
    n = ok ? static_cast<int64_t>(v.get<uint64_t>()) : 0;
  } else if (v.is_number_integer()) {
    ok = true;
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && std::floor(d) == d && d >= -9e18 && d <= 9e18;
    n = ok ? static_cast<int64_t>(d) : 0;
  }
  if (!ok || n < lo || n > hi)
    throw InputError(file, key,
                     "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got " + show(v));
  return n;
}

const json& field(const json& obj, const std::string& key, const std::string& file,
                  const std::string& prefix) {
  if (!obj.contains(key)) throw InputError(file, prefix + key, "present, but it is missing");
  return obj.at(key);
}

int64_t int_field(const json& obj, const std::string& key, int64_t lo, int64_t hi,
                  const std::string& file, const std::string& prefix = "") {
  return int_in(field(obj, key, file, prefix), lo, hi, file, prefix + key);
}

std::string string_field(const json& obj, const std::string& key, const std::string& file,
                         const std::string& prefix = "") {
  const json& v = field(obj, key, file, prefix);
  if (!v.is_string()) throw InputError(file, prefix + key, "expected a string, got " + show(v));
  return v.get<std::string>();
}

void expect_string(const json& obj, const std::string& key, const std::string& want,
                   const std::string& file) {
  const json& v = field(obj, key, file, "");
  if (v != want) throw InputError(file, key, "expected \"" + want + "\", got " + show(v));
}

// `v` is an object holding exactly `keys` (each one's value is checked by the caller).
void exact_object(const json& v, const std::vector<std::string>& keys, const std::string& file,
                  const std::string& where) {
  if (!v.is_object()) throw InputError(file, where, "expected a JSON object, got " + show(v));
  std::string list;
  for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
  for (const auto& [k, value] : v.items())
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      throw InputError(file, (where.empty() ? "" : where + ".") + k,
                       "a known key (" + list + "), got an unknown one");
  for (const std::string& k : keys)
    if (!v.contains(k))
      throw InputError(file, (where.empty() ? "" : where + ".") + k, "present, but it is missing");
}

std::string rank_file(int r) {
  return "rank_" + std::to_string(r) + ".safetensors";
}

// rank_<r>.safetensors → r (as rank_file spells it); -1 for any other name.
int rank_of_file(const std::string& name) {
  const std::string head = "rank_", tail = ".safetensors";
  if (name.size() <= head.size() + tail.size() || name.rfind(head, 0) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return -1;
  const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits[0] == '0' && digits.size() > 1))
    return -1;
  return std::stoi(digits);
}

struct FileRecord {
  int64_t bytes = 0;
  std::string crc32;  // 8 lowercase hex digits
  // Format 2's rank files: the bytes before the data section and their CRC-32, so that a rank
  // can trust a header without reading the whole file.
  int64_t header_bytes = -1;
  std::string header_crc32;
};

// metadata.json: the checkpoint's iteration, world size, and the size and CRC-32 of exactly the
// files a load reads (run_state.json and one shard per rank): a file no checksum covers is never
// read.
struct Manifest {
  int format = 2;  // strata-checkpoint-<format>
  int iteration = 0;
  int world_size = 0;
  std::map<std::string, FileRecord> files;  // [file name]
};

// The directory's name as written (trailing slashes dropped), for iter_<N>.
std::string dir_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

Manifest read_manifest(const std::string& path) {
  const std::string file = path + "/metadata.json";
  if (!fs::exists(file)) throw InputError(file, "", "a checkpoint's metadata.json, found none");
  const json j = read_json_file(file);
  exact_object(j, {"format", "iteration", "world_size", "checksum", "files"}, file, "");
  Manifest m;
  // Format 1 (before block checksums) is still read: its files are checksummed whole.
  if (j.at("format") == "strata-checkpoint-1")
    m.format = 1;
  else
    expect_string(j, "format", "strata-checkpoint-2", file);
  expect_string(j, "checksum", "crc32-ieee", file);
  m.iteration = static_cast<int>(int_field(j, "iteration", 0, INT_MAX, file));
  const int named = iteration_of(dir_name(path));
  if (named >= 0 && named != m.iteration)
    throw InputError(file, "iteration",
                     "expected " + std::to_string(named) + " (the directory's name), got " +
                         std::to_string(m.iteration));
  m.world_size = static_cast<int>(int_field(j, "world_size", 1, INT_MAX, file));
  const json& files = j.at("files");
  if (!files.is_object()) throw InputError(file, "files", "expected an object of file entries");
  for (const auto& [name, e] : files.items()) {
    const std::string where = "files." + name;
    const int rank = rank_of_file(name);
    if (name != "run_state.json" && !(rank >= 0 && rank < m.world_size))
      throw InputError(file, where,
                       "only run_state.json and rank_0.safetensors … " +
                           rank_file(m.world_size - 1) + " (world_size " +
                           std::to_string(m.world_size) + "), got this entry");
    const bool headed = m.format >= 2 && rank >= 0;
    exact_object(e,
                 headed ? std::vector<std::string>{"bytes", "crc32", "header_bytes", "header_crc32"}
                        : std::vector<std::string>{"bytes", "crc32"},
                 file, where);
    FileRecord r;
    r.bytes = int_field(e, "bytes", 0, INT64_MAX, file, where + ".");
    const auto hex_field = [&](const char* key) {
      const std::string v = string_field(e, key, file, where + ".");
      if (v.size() != 8 || v.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw InputError(file, where + "." + key,
                         "expected 8 lowercase hexadecimal digits, got \"" + v + "\"");
      return v;
    };
    r.crc32 = hex_field("crc32");
    if (headed) {
      r.header_bytes = int_field(e, "header_bytes", 8, r.bytes, file, where + ".");
      r.header_crc32 = hex_field("header_crc32");
    }
    m.files[name] = r;
  }
  // Every file a load reads must be covered: the run state and the shard of every rank.
  std::vector<std::string> needed = {"run_state.json"};
  for (int r = 0; r < m.world_size; ++r) needed.push_back(rank_file(r));
  for (const std::string& n : needed)
    if (!m.files.count(n))
      throw InputError(file, "files",
                       "an entry (bytes, CRC-32) for " + n + " (world_size " +
                           std::to_string(m.world_size) + "), found none");
  return m;
}

// The file's size against its record, before a byte of it is believed.
void check_size(const std::string& file, const FileRecord& rec) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) throw InputError(file, "", "a readable file (metadata.json lists it): " + ec.message());
  if (static_cast<int64_t>(size) != rec.bytes)
    throw InputError(file, "",
                     std::to_string(rec.bytes) + " bytes as metadata.json records, found " +
                         std::to_string(size) + " (truncated or extended)");
}

void check_crc(const std::string& file, const FileRecord& rec, uint32_t crc) {
  if (crc_hex(crc) != rec.crc32)
    throw InputError(file, "",
                     "CRC-32 " + rec.crc32 + " as metadata.json records, found " + crc_hex(crc) +
                         " (corrupted)");
}

// run_state.json, every key as saved by launch/train/checkpointing.cc.
json read_run_state(const std::string& path, const Manifest& m) {
  const std::string file = path + "/run_state.json";
  const FileRecord& rec = m.files.at("run_state.json");
  check_size(file, rec);
  const std::string text = read_file(file);
  check_crc(file, rec, crc32_ieee(text.data(), text.size()));
  const json rs = parse_json(text, file);
  exact_object(rs,
               {"format", "iteration", "optimizer_steps", "data_position", "seed", "rng",
                "nonfinite_in_a_row", "world_size", "model", "parallel", "train", "config_file"},
               file, "");
  expect_string(rs, "format", "strata-run-state-1", file);
  const int64_t it = int_field(rs, "iteration", 0, INT_MAX, file);
  if (it != m.iteration)
    throw InputError(file, "iteration",
                     "expected " + std::to_string(m.iteration) + " as metadata.json records, got " +
                         std::to_string(it));
  // At most one optimizer step per iteration; five non-finite steps in a row end a run.
  int_field(rs, "optimizer_steps", 0, it, file);
  int_field(rs, "data_position", 0, INT64_MAX, file);
  int_field(rs, "seed", 0, INT64_MAX, file);
  string_field(rs, "rng", file);
  int_field(rs, "nonfinite_in_a_row", 0, 4, file);
  const int64_t world = int_field(rs, "world_size", 1, INT_MAX, file);
  if (world != m.world_size)
    throw InputError(file, "world_size",
                     "expected " + std::to_string(m.world_size) +
                         " as metadata.json records, got " + std::to_string(world));
  const json& model = rs.at("model");
  if (!model.is_object()) throw InputError(file, "model", "expected an object of model keys");
  string_field(model, "arch", file, "model.");
  const json& par = rs.at("parallel");
  exact_object(par,
               {"tensor", "pipeline", "data", "virtual_stages", "schedule", "sequence_parallel",
                "distributed_optimizer"},
               file, "parallel");
  int64_t ranks = 1;
  for (const char* k : {"tensor", "pipeline", "data"})
    ranks *= int_field(par, k, 1, INT_MAX, file, "parallel.");
  if (ranks != world)
    throw InputError(file, "parallel",
                     "tensor × pipeline × data = world_size " + std::to_string(world) + ", got " +
                         std::to_string(ranks));
  int_field(par, "virtual_stages", 1, INT_MAX, file, "parallel.");
  string_field(par, "schedule", file, "parallel.");
  for (const char* k : {"sequence_parallel", "distributed_optimizer"})
    if (!par.at(k).is_boolean())
      throw InputError(file, std::string("parallel.") + k,
                       "expected a boolean, got " + show(par.at(k)));
  const json& train = rs.at("train");
  exact_object(train, {"iterations", "micro_batch_size", "global_batch_size"}, file, "train");
  int_field(train, "iterations", 0, INT_MAX, file, "train.");
  int_field(train, "micro_batch_size", 1, INT_MAX, file, "train.");
  int_field(train, "global_batch_size", 1, INT_MAX, file, "train.");
  string_field(rs, "config_file", file);
  return rs;
}

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

// A rank file opened as far as its header: checked, and nothing of the data read.
struct ShardHeader {
  std::string file;
  FileRecord rec;
  int format = 1;
  std::string head;  // the bytes before the data section: the length prefix and the JSON
  int64_t data_start = 0, data_bytes = 0;
  int64_t block_bytes = 0;           // format 2: the data's CRC-32 blocks (format 1: none)
  std::vector<uint32_t> block_crcs;  // [block]
  RankShard shard;                   // meta entries; pieces without values, in offset order
  std::vector<int64_t> offsets;      // [piece] bytes into the data section
  std::vector<int64_t> counts;       // [piece] elements
};

// Reads exactly `n` bytes at `offset` of the open file; InputError naming `file` otherwise.
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

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

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
      throw InputError(file, where, "a JSON object (full_shape, shard_shape, split, tp_rank, tp)");
    }
    exact_object(j, {"full_shape", "shard_shape", "split", "tp_rank", "tp"}, file, where);
    ShardMeta m;
    m.full_shape = shape_field(j, "full_shape", file, where);
    m.shard_shape = shape_field(j, "shard_shape", file, where);
    m.split = string_field(j, "split", file, where + ".");
    m.tp = static_cast<int>(int_field(j, "tp", 1, 1 << 20, file, where + "."));
    m.tp_rank = static_cast<int>(int_field(j, "tp_rank", 0, m.tp - 1, file, where + "."));
    // A shard is 1/tp of the full tensor (a replicated parameter is written with tp 1).
    if (m.full_shape.size() != m.shard_shape.size() ||
        numel_of(m.full_shape) / m.tp != numel_of(m.shard_shape) ||
        numel_of(m.full_shape) % m.tp != 0)
      throw InputError(file, where,
                       "a shard_shape with full_shape's number of dimensions and 1/" +
                           std::to_string(m.tp) + " of its elements (tp " + std::to_string(m.tp) +
                           "), got full_shape " + show(j.at("full_shape")) + ", shard_shape " +
                           show(j.at("shard_shape")));
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

void check_block(const ShardHeader& h, int64_t block, uint32_t crc) {
  const uint32_t want = h.block_crcs[static_cast<size_t>(block)];
  if (crc != want)
    throw InputError(h.file, "byte " + std::to_string(h.data_start + block * h.block_bytes),
                     "a data block of CRC-32 " + crc_hex(want) + " as the header records, found " +
                         crc_hex(crc) + " (corrupted)");
}

// Streams the data section, piece by piece in offset order (they tile it), through the file's
// CRC-32 (and format 2's block CRC-32s): every byte is checked as it is read, and with `keep`
// the pieces' values are the bytes that were checked.
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

// Across the rank files: one full shape per tensor, and as many elements written as it has
// (where each lands is the model layer's business: launch/train/model_state.h).
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

// Every rank file's header, then the coverage across them.
std::vector<ShardHeader> read_shard_headers(const std::string& path, const Manifest& m) {
  std::vector<ShardHeader> shards;
  for (int r = 0; r < m.world_size; ++r)
    shards.push_back(
        read_shard_header(path + "/" + rank_file(r), m.files.at(rank_file(r)), m.format));
  return shards;
}

// Reads (keep_values) or only checks a checkpoint: metadata.json, then each file against it.
LoadedCheckpoint read_checked(const std::string& path, bool keep_values) {
  LoadedCheckpoint c;
  c.path = path;
  const Manifest m = read_manifest(path);
  c.run_state = read_run_state(path, m);
  std::vector<ShardHeader> shards = read_shard_headers(path, m);
  for (ShardHeader& h : shards) check_shard_data(h, keep_values);
  check_coverage(path, shards);
  if (keep_values)
    for (ShardHeader& h : shards) c.shards.push_back(std::move(h.shard));
  return c;
}

}  // namespace

namespace {

// Step 1 of a save: rank 0 creates <dir>/iter_<N>.tmp-<random>; every rank learns its name (the
// gather also orders the mkdir before any rank writes). Collective.
std::string make_save_dir(Communicator& host, const std::string& dir,
                          const std::string& final_dir) {
  std::string tmp;
  if (host.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::random_device rd;
    tmp = final_dir + ".tmp-" + crc_hex(rd());
    if (!fs::create_directory(tmp, ec)) io_fail("cannot create directory", tmp);
  }
  return all_gather_strings(host, tmp)[0];
}

// Step 2: this rank's shard into `tmp`, written piece by piece from the shard itself (no second
// copy of GBs of state) and fsync'ed. Returns its metadata.json entry, or {"error": why} when a
// write failed (a full disk). No communication: the background writer thread runs it.
nlohmann::json write_shard(const std::string& tmp, int rank, int world, int iteration,
                           const RankShard& mine) {
  const std::string file = rank_file(rank);
  try {
    if (const char* ms = std::getenv("STRATA_TEST_SLOW_SAVE_MS"))
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
    uint32_t data_crc = 0;
    const std::string header = shard_header(mine, &data_crc);
    std::vector<Chunk> chunks = {{header.data(), header.size()}};
    for (const ShardPiece& p : mine.pieces)
      chunks.push_back(
          {reinterpret_cast<const char*>(p.values.data()), p.values.size() * sizeof(float)});
    size_t bytes = 0;
    write_chunks_synced(tmp + "/" + file, chunks, &bytes);
    kill_hook(iteration, rank, world);
    const uint32_t header_crc = crc32_ieee(header.data(), header.size());
    return {{"file", file},
            {"bytes", bytes},
            {"crc32", crc_hex(crc32_concat(header_crc, data_crc,
                                           static_cast<int64_t>(bytes - header.size())))},
            {"header_bytes", header.size()},
            {"header_crc32", crc_hex(header_crc)}};
  } catch (const std::exception& e) {
    return {{"file", file}, {"error", e.what()}};
  }
}

// Step 3, collective: every rank's entry reaches rank 0, which writes run_state.json and
// metadata.json, renames the directory to iter_<N> (the checkpoint exists from here on),
// replaces latest and prunes. A write that failed on any rank fails the save on every rank
// (std::runtime_error naming the rank's error) after the temporary directory is removed.
std::string publish_save(Communicator& host, const std::string& dir, int iteration,
                         const nlohmann::json& mine, const nlohmann::json& run_state, int keep,
                         const std::string& tmp, const std::string& final_dir) {
  const int rank = host.rank();
  const std::vector<std::string> entries = all_gather_strings(host, mine.dump());
  try {
    for (size_t r = 0; r < entries.size(); ++r) {
      const nlohmann::json j = nlohmann::json::parse(entries[r]);
      if (j.contains("error"))
        throw std::runtime_error(j.at("error").get<std::string>() + " (rank " + std::to_string(r) +
                                 ")");
    }
    if (rank == 0) {
      nlohmann::json files = nlohmann::json::object();
      for (const std::string& e : entries) {
        nlohmann::json j = nlohmann::json::parse(e);
        const std::string file = j.at("file").get<std::string>();
        j.erase("file");
        files[file] = j;
      }
      const std::string rs = run_state.dump(2) + "\n";
      write_file_synced(tmp + "/run_state.json", rs);
      files["run_state.json"] = {{"bytes", rs.size()},
                                 {"crc32", crc_hex(crc32_ieee(rs.data(), rs.size()))}};
      const nlohmann::json meta = {{"format", "strata-checkpoint-2"},
                                   {"iteration", iteration},
                                   {"world_size", host.size()},
                                   {"checksum", "crc32-ieee"},
                                   {"files", files}};
      write_file_synced(tmp + "/metadata.json", meta.dump(2) + "\n");
      fsync_dir(tmp);
      exit_if_orphaned();  // and before it publishes the checkpoint
      std::error_code ec;
      // A rerun that resumed from an older checkpoint saves this iteration again.
      if (fs::exists(final_dir)) fs::remove_all(final_dir, ec);
      if (::rename(tmp.c_str(), final_dir.c_str()) != 0) io_fail("cannot rename to", final_dir);
      fsync_dir(dir);
      write_file_synced(dir + "/latest.tmp", "iter_" + std::to_string(iteration) + "\n");
      if (::rename((dir + "/latest.tmp").c_str(), (dir + "/latest").c_str()) != 0)
        io_fail("cannot rename to", dir + "/latest");
      fsync_dir(dir);
      prune(dir, keep, final_dir);
    }
  } catch (const std::exception&) {
    // A failed save (a full disk) leaves nothing half-written behind for the next start to trip
    // over; the job ends on the error (the other ranks' files go with the directory).
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (rank == 0) fs::remove(dir + "/latest.tmp", ec);
    throw;
  }
  host.barrier();
  return final_dir;
}

}  // namespace

std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep) {
  // A rank whose launcher is gone stops before it writes anything (watchdog.h).
  exit_if_orphaned();
  const std::string final_dir = dir + "/iter_" + std::to_string(iteration);
  const std::string tmp = make_save_dir(host, dir, final_dir);
  const nlohmann::json entry = write_shard(tmp, host.rank(), host.size(), iteration, mine);
  return publish_save(host, dir, iteration, entry, run_state, keep, tmp, final_dir);
}

// ---- CheckpointSaver ----

struct CheckpointSaver::Pending {
  int64_t number = 0;
  int iteration = 0;
  std::string tmp, final_dir;
  nlohmann::json run_state;
  RankShard shard;       // the snapshot; released by the writer once it is on disk
  nlohmann::json entry;  // the writer's result
  std::atomic<bool> written{false};
  double write_s = 0;
  std::thread writer;
};

CheckpointSaver::CheckpointSaver(Communicator& host, std::string dir, int keep, bool background)
    : host_(host), dir_(std::move(dir)), keep_(keep), background_(background) {}

CheckpointSaver::~CheckpointSaver() {
  // An unpublished save stays a temporary directory, which the next start removes.
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

int64_t CheckpointSaver::pending() const {
  return pending_ ? pending_->number : -1;
}

bool CheckpointSaver::writing() const {
  return pending_ && !pending_->written.load();
}

std::string CheckpointSaver::save(int iteration, RankShard mine, nlohmann::json run_state) {
  // A second save waits for the first: at most one snapshot in memory, saves in order.
  publish(pending());
  exit_if_orphaned();  // a rank whose launcher is gone stops before it writes anything
  auto p = std::make_unique<Pending>();
  p->number = saves_++;
  p->iteration = iteration;
  p->final_dir = dir_ + "/iter_" + std::to_string(iteration);
  p->tmp = make_save_dir(host_, dir_, p->final_dir);
  p->run_state = std::move(run_state);
  p->shard = std::move(mine);
  const int rank = host_.rank(), world = host_.size();
  Pending* raw = p.get();
  auto write = [raw, rank, world] {
    const auto t0 = std::chrono::steady_clock::now();
    raw->entry = write_shard(raw->tmp, rank, world, raw->iteration, raw->shard);
    raw->shard = RankShard();
    raw->write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    raw->written.store(true);
  };
  pending_ = std::move(p);
  if (!background_) {
    write();
    return publish(pending());
  }
  pending_->writer = std::thread(write);
  return "";
}

std::string CheckpointSaver::publish(int64_t save) {
  if (!pending_ || pending_->number != save) return "";
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  last_write_s_ = p->write_s;
  return publish_save(host_, dir_, p->iteration, p->entry, p->run_state, keep_, p->tmp,
                      p->final_dir);
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

// ---- CheckpointReader ----

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
