// shard_format.cc — the bytes of a shard file (shard.h), the CRC-32s that cover them, and the
// names of a checkpoint's files and directories.
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "runtime/checkpoint/checkpoint_internal.h"

namespace strata {

uint32_t crc32_ieee(const void* data, size_t n, uint32_t crc) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

uint32_t crc32_concat(uint32_t a, uint32_t b, int64_t b_bytes) {
  return static_cast<uint32_t>(crc32_combine(a, b, static_cast<z_off_t>(b_bytes)));
}

namespace checkpoint_internal {
namespace fs = std::filesystem;

int64_t block_bytes_for(int64_t data_bytes) {
  int64_t b = kMinBlockBytes;
  while ((data_bytes + b - 1) / b > kMaxBlocks) b *= 2;
  return b;
}

std::string crc_hex(uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", c);
  return buf;
}

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

std::string rank_file(int r) {
  return "rank_" + std::to_string(r) + ".safetensors";
}

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

std::string shard_header(const RankShard& s, uint32_t* data_crc) {
  nlohmann::ordered_json j;
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [name, m] : s.meta) {
    nlohmann::json one{{"full_shape", m.full_shape},
                       {"shard_shape", m.shard_shape},
                       {"split", m.split},
                       {"tp_rank", m.tp_rank},
                       {"tp", m.tp}};
    if (m.expert > 1) {
      one["expert_rank"] = m.expert_rank;
      one["expert"] = m.expert;
    }
    meta["meta:" + name] = one.dump();
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

}  // namespace checkpoint_internal

std::string serialize_shard(const RankShard& s) {
  std::string out = checkpoint_internal::shard_header(s);
  for (const ShardPiece& p : s.pieces)
    out.append(reinterpret_cast<const char*>(p.values.data()), p.values.size() * sizeof(float));
  return out;
}

}  // namespace strata
