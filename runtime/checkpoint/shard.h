// shard.h — what one rank saves of a checkpoint (RankShard) and the bytes of its file
// (checkpoint.h describes the directory it lands in).
//
// A shard file is safetensors (runtime/io/safetensors.h): one F32 vector per piece, named
// "param:<name>", "param_prev:<name>" (2bw's older weights), "m:<name>:<first local element>" or
// "v:…", in the order of RankShard::pieces; the metadata holds "meta:<name>" (where the shard
// sits in the full tensor, as JSON) and the data's block CRC-32s ("crc32_block_bytes",
// "crc32_blocks"). The header is padded with spaces so the data starts 8-byte aligned.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata {

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320): zlib's crc32(); chain with `crc`.
uint32_t crc32_ieee(const void* data, size_t n, uint32_t crc = 0);
// The CRC-32 of bytes A then B from theirs (zlib's crc32_combine), B being b_bytes long.
uint32_t crc32_concat(uint32_t a, uint32_t b, int64_t b_bytes);

// Where one rank's shard of a parameter sits in the full tensor.
struct ShardMeta {
  std::vector<int64_t> full_shape;
  std::vector<int64_t> shard_shape;
  std::string
      split;  // "replicated", "rows", "cols", "qkv_rows" (models/layers/params.h ParamSplit)
  int tp_rank = 0;
  int tp = 1;
  // An expert-split parameter (models/layers/params.h): the shard is tensor shard tp_rank of
  // run expert_rank of `expert` equal runs of whole rows. Written only when expert > 1.
  int expert_rank = 0;
  int expert = 1;
};

// A run of consecutive elements [local_begin, +values.size()) of one rank's shard.
struct ShardPiece {
  std::string kind;  // "param", "m", "v"; "param_prev": 2bw's older weight version
  std::string name;
  int64_t local_begin = 0;
  std::vector<float> values;
};

struct RankShard {
  std::map<std::string, ShardMeta> meta;  // [parameter name]
  std::vector<ShardPiece> pieces;
};

// The bytes of rank_<r>.safetensors for `s`.
std::string serialize_shard(const RankShard& s);

}  // namespace strata
