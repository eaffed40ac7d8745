#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/json_file.h"
#include "runtime/safetensors.h"
#include "runtime/watchdog.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

// Slice-by-8 tables: t[0] is the classic byte table, t[k][i] the CRC of byte i followed by k
// zero bytes, so eight bytes are folded per step (~5x the byte loop; checkpoints are GBs).
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;
CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  return t;
}

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

struct Chunk {
  const char* data;
  size_t size;
};

// Writes the chunks to `path` in order and fsyncs it: after this returns the data survives a
// crash. Returns the file's CRC-32 and adds its size to *bytes.
uint32_t write_chunks_synced(const std::string& path, const std::vector<Chunk>& chunks,
                             size_t* bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot create", path);
  uint32_t crc = 0;
  for (const Chunk& c : chunks) {
    crc = crc32_ieee(c.data, c.size, crc);
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
  return crc;
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
  static const CrcTables t = make_crc_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, p, 4);  // little-endian hosts only (as the safetensors data itself)
    std::memcpy(&b, p + 4, 4);
    a ^= crc;
    crc = t[7][a & 0xFFu] ^ t[6][(a >> 8) & 0xFFu] ^ t[5][(a >> 16) & 0xFFu] ^ t[4][a >> 24] ^
          t[3][b & 0xFFu] ^ t[2][(b >> 8) & 0xFFu] ^ t[1][(b >> 16) & 0xFFu] ^ t[0][b >> 24];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

namespace {
// The length prefix and JSON header of a shard file (the data follows, piece by piece).
std::string shard_header(const RankShard& s) {
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
};

// metadata.json: the checkpoint's iteration, world size, and the size and CRC-32 of exactly the
// files a load reads (run_state.json and one shard per rank): a file no checksum covers is never
// read.
struct Manifest {
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
  expect_string(j, "format", "strata-checkpoint-1", file);
  expect_string(j, "checksum", "crc32-ieee", file);
  Manifest m;
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
    exact_object(e, {"bytes", "crc32"}, file, where);
    FileRecord r;
    r.bytes = int_field(e, "bytes", 0, INT64_MAX, file, where + ".");
    r.crc32 = string_field(e, "crc32", file, where + ".");
    if (r.crc32.size() != 8 || r.crc32.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw InputError(file, where + ".crc32",
                       "expected 8 lowercase hexadecimal digits, got \"" + r.crc32 + "\"");
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

// One shard file: the header is checked (every tensor an F32 vector named param:<name>,
// m:<name>:<first element> or v:…, inside its parameter's shard, which a "meta:<name>" entry
// places in the full tensor), and every byte goes through the CRC-32 as it is read. The values
// are kept when `keep_values` (else only read, for the checksum: the pieces are left empty and
// `sizes` says how long each one is).
RankShard read_shard(const std::string& file, const FileRecord& rec, bool keep_values,
                     std::vector<int64_t>* sizes) {
  check_size(file, rec);
  std::optional<StReader> reader;
  try {
    reader.emplace(file);
  } catch (const InputError&) {
    // A header that does not parse is corrupt when its bytes are not the recorded ones: say so.
    const std::string bytes = read_file(file);
    check_crc(file, rec, crc32_ieee(bytes.data(), bytes.size()));
    throw;
  }
  StReader& r = *reader;
  uint32_t crc = 0;
  {
    std::string head(static_cast<size_t>(r.data_start()), '\0');
    std::ifstream in(file, std::ios::binary);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    if (!in) throw InputError(file, "byte 0", "a readable header");
    crc = crc32_ieee(head.data(), head.size());
  }
  // The tensors tile the data section (StReader checked it): in offset order their bytes are
  // the rest of the file.
  std::vector<const std::pair<const std::string, StEntry>*> order;
  for (const auto& e : r.entries()) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::make_pair(a->second.begin, a->second.end) <
           std::make_pair(b->second.begin, b->second.end);
  });
  std::map<std::string, std::vector<float>> values;  // [tensor key]
  for (const auto* e : order) {
    StTensor t = r.read(e->first);
    crc = crc32_ieee(t.data.data(), t.data.size(), crc);
    if (keep_values && t.dtype == "F32") values[e->first] = t.as_f32();
  }
  check_crc(file, rec, crc);

  RankShard s;
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
    if (keep_values) p.values = std::move(values[key]);
    if (sizes) sizes->push_back(t.shape[0]);
    s.pieces.push_back(std::move(p));
  }
  return s;
}

// Across the rank files: one full shape per tensor, and as many elements written as it has
// (where each lands is the model layer's business: launch/train/model_state.h).
void check_coverage(const std::string& path, const std::vector<RankShard>& shards,
                    const std::vector<std::vector<int64_t>>& sizes) {
  std::map<std::string, std::pair<std::vector<int64_t>, int>> full;  // [name] (shape, rank)
  std::map<std::string, int64_t> written;                            // [kind:name]
  for (size_t r = 0; r < shards.size(); ++r) {
    for (const auto& [name, m] : shards[r].meta) {
      const auto [it, fresh] = full.emplace(name, std::make_pair(m.full_shape, int(r)));
      if (!fresh && it->second.first != m.full_shape)
        throw InputError(path + "/" + rank_file(int(r)), "__metadata__.meta:" + name,
                         "the full_shape " + show(json(it->second.first)) + " of " +
                             rank_file(it->second.second) + ", got " + show(json(m.full_shape)));
    }
    for (size_t i = 0; i < shards[r].pieces.size(); ++i) {
      const ShardPiece& p = shards[r].pieces[i];
      written[p.kind + ":" + p.name] += sizes[r][i];
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

// Reads (keep_values) or only checks a checkpoint: metadata.json, then each file against it.
LoadedCheckpoint read_checked(const std::string& path, bool keep_values) {
  LoadedCheckpoint c;
  c.path = path;
  const Manifest m = read_manifest(path);
  c.run_state = read_run_state(path, m);
  std::vector<std::vector<int64_t>> sizes(static_cast<size_t>(m.world_size));
  for (int r = 0; r < m.world_size; ++r)
    c.shards.push_back(read_shard(path + "/" + rank_file(r), m.files.at(rank_file(r)), keep_values,
                                  &sizes[static_cast<size_t>(r)]));
  check_coverage(path, c.shards, sizes);
  if (!keep_values) c.shards.clear();
  return c;
}

}  // namespace

namespace {

// Steps 1-3 of the save (checkpoint.h) after rank 0 has created `tmp`: every rank's shard, then
// rank 0's run_state.json, metadata.json, the rename and latest.
void write_checkpoint_files(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep,
                            const std::string& tmp, const std::string& final_dir) {
  const int rank = host.rank();
  const std::string file = "rank_" + std::to_string(rank) + ".safetensors";
  // Written piece by piece from the shard itself: no second copy of GBs of state in memory.
  const std::string header = shard_header(mine);
  std::vector<Chunk> chunks = {{header.data(), header.size()}};
  for (const ShardPiece& p : mine.pieces)
    chunks.push_back(
        {reinterpret_cast<const char*>(p.values.data()), p.values.size() * sizeof(float)});
  size_t bytes = 0;
  const uint32_t crc = write_chunks_synced(tmp + "/" + file, chunks, &bytes);
  kill_hook(iteration, rank, host.size());
  const nlohmann::json entry = {{"file", file}, {"bytes", bytes}, {"crc32", crc_hex(crc)}};
  // Every shard is on disk once this returns on rank 0.
  const std::vector<std::string> entries = all_gather_strings(host, entry.dump());

  if (rank == 0) {
    nlohmann::json files = nlohmann::json::object();
    for (const std::string& e : entries) {
      const nlohmann::json j = nlohmann::json::parse(e);
      files[j.at("file").get<std::string>()] = {{"bytes", j.at("bytes")}, {"crc32", j.at("crc32")}};
    }
    const std::string rs = run_state.dump(2) + "\n";
    write_file_synced(tmp + "/run_state.json", rs);
    files["run_state.json"] = {{"bytes", rs.size()},
                               {"crc32", crc_hex(crc32_ieee(rs.data(), rs.size()))}};
    const nlohmann::json meta = {{"format", "strata-checkpoint-1"},
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
}

}  // namespace

std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep) {
  // A rank whose launcher is gone stops before it writes anything (watchdog.h).
  exit_if_orphaned();
  const int rank = host.rank();
  const std::string final_dir = dir + "/iter_" + std::to_string(iteration);
  std::string tmp;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::random_device rd;
    tmp = final_dir + ".tmp-" + crc_hex(rd());
    if (!fs::create_directory(tmp, ec)) io_fail("cannot create directory", tmp);
  }
  // Rank 0's name for everyone; the gather also orders the mkdir before any rank writes.
  tmp = all_gather_strings(host, tmp)[0];
  try {
    write_checkpoint_files(host, dir, iteration, mine, run_state, keep, tmp, final_dir);
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
