#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/safetensors.h"

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

// Size and CRC-32 of a file, streamed in blocks (checkpoint files are GBs); false if unreadable
// or not a regular file.
bool file_crc(const std::string& path, size_t* size, uint32_t* crc) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::vector<char> block(size_t{8} << 20);
  *size = 0;
  *crc = 0;
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    *crc = crc32_ieee(block.data(), got, *crc);
    *size += got;
  }
  return true;
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
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp-") != std::string::npos)
      fs::remove_all(e.path(), ec);
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
    const std::string key = p.kind == "param"
                                ? "param:" + p.name
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

RankShard parse_shard(const std::string& path) {
  StFile f = read_safetensors(path);
  RankShard s;
  for (const auto& [key, value] : f.metadata) {
    if (key.rfind("meta:", 0) != 0) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(value);
      ShardMeta m;
      m.full_shape = j.at("full_shape").get<std::vector<int64_t>>();
      m.shard_shape = j.at("shard_shape").get<std::vector<int64_t>>();
      m.split = j.at("split").get<std::string>();
      m.tp_rank = j.at("tp_rank").get<int>();
      m.tp = j.at("tp").get<int>();
      s.meta[key.substr(5)] = m;
    } catch (const nlohmann::json::exception&) {
      throw InputError(path, "__metadata__." + key, "full_shape, shard_shape, split, tp_rank, tp");
    }
  }
  for (auto& [key, t] : f.tensors) {
    ShardPiece p;
    const size_t c1 = key.find(':');
    if (c1 == std::string::npos) throw InputError(path, "tensor " + key, "kind:name[:offset]");
    p.kind = key.substr(0, c1);
    if (p.kind == "param") {
      p.name = key.substr(c1 + 1);
    } else {
      const size_t c2 = key.rfind(':');
      if (c2 == c1 || (p.kind != "m" && p.kind != "v"))
        throw InputError(path, "tensor " + key, "param:<name>, m:<name>:<offset> or v:…");
      p.name = key.substr(c1 + 1, c2 - c1 - 1);
      p.local_begin = std::atoll(key.c_str() + c2 + 1);
    }
    if (!s.meta.count(p.name))
      throw InputError(path, "tensor " + key, "a meta:" + p.name + " entry");
    p.values = t.as_f32();
    std::vector<char>().swap(t.data);  // the raw copy is done with: halve the peak memory
    s.pieces.push_back(std::move(p));
  }
  return s;
}

std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep) {
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
  host.barrier();
  return final_dir;
}

std::string verify_checkpoint(const std::string& path) {
  const std::string meta_path = path + "/metadata.json";
  const std::string text = read_file(meta_path);
  if (text.empty()) return meta_path + ": missing or empty";
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(text);
    if (!meta.at("files").is_object() || !meta.at("files").contains("run_state.json"))
      return meta_path + ": no run_state.json entry";
  } catch (const nlohmann::json::exception&) {
    return meta_path + ": not a complete metadata JSON";
  }
  for (const auto& [name, e] : meta.at("files").items()) {
    const std::string f = path + "/" + name;
    size_t size = 0;
    uint32_t c = 0;
    if (!file_crc(f, &size, &c)) return f + ": missing or unreadable";
    const size_t want = e.value("bytes", size_t{0});
    if (size != want)
      return f + ": " + std::to_string(size) + " bytes, metadata.json records " +
             std::to_string(want) + " (truncated or extended)";
    const std::string crc = crc_hex(c);
    if (crc != e.value("crc32", std::string()))
      return f + ": CRC-32 " + crc + " differs from metadata.json's " +
             e.value("crc32", std::string()) + " (corrupted)";
  }
  return "";
}

std::optional<std::string> select_checkpoint(const std::optional<std::string>& dir,
                                             const std::string& resume, std::ostream& err) {
  if (resume == "none") return std::nullopt;
  if (resume != "auto") {
    const std::string why = verify_checkpoint(resume);
    if (!why.empty()) throw InputError(resume, "", "a complete checkpoint: " + why);
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
  LoadedCheckpoint c;
  c.path = path;
  const std::string rs_path = path + "/run_state.json";
  try {
    c.run_state = nlohmann::json::parse(read_file(rs_path));
  } catch (const nlohmann::json::exception&) {
    throw InputError(rs_path, "", "a run state JSON object");
  }
  const int world = c.run_state.value("world_size", 0);
  if (world <= 0) throw InputError(rs_path, "world_size", "a positive integer");
  for (int r = 0; r < world; ++r)
    c.shards.push_back(parse_shard(path + "/rank_" + std::to_string(r) + ".safetensors"));
  return c;
}

}  // namespace strata
