// checkpoint.h — crash-safe checkpoints on disk, independent of the model and of the layout.
//
// A checkpoint is a directory <dir>/iter_<N> holding
//   rank_<r>.safetensors  what world rank r owns, in full-index form: for each parameter it
//                         writes, the shard ("param:<name>"), and the AdamW moments of the
//                         elements whose optimizer state it owns ("m:<name>:<first local
//                         element>", "v:…"); the metadata entry "meta:<name>" says where the
//                         shard sits in the full tensor (full shape, shard shape, split kind,
//                         tensor rank and size), so any layout can rebuild its own shards.
//   run_state.json        (rank 0) iteration, optimizer steps, data position, seed, model shape,
//                         the parallel layout it was saved under
//   metadata.json         (rank 0) byte size and CRC-32 of every other file
// Nothing else carries state: sampling is a pure function of (seed, split, iteration, slot) and
// the model has no dropout randomness in use, so no RNG state is saved beyond the seed.
//
// Crash safety: everything is written into <dir>/iter_<N>.tmp-<random>, each file fsync'ed; all
// ranks meet (all-gather of the shard checksums) before rank 0 writes metadata.json, renames the
// directory to iter_<N> (atomic on POSIX), fsyncs <dir>, then replaces <dir>/latest (written as
// latest.tmp, renamed). A directory is loadable only under its final name and only when every
// file matches metadata.json, so a kill at any point leaves either the previous checkpoints or
// the new one complete.
//
// Test hook: STRATA_TEST_KILL_DURING_SAVE=<N> makes world rank 1 (rank 0 in a one-rank run)
// SIGKILL itself after writing its shard of iteration N, before the rename.
//
// Thread-safety: call from the training thread; save is collective over `host`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/comm.h"

namespace strata {

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib's crc32(); chain with `crc`.
uint32_t crc32_ieee(const void* data, size_t n, uint32_t crc = 0);

// Where one rank's shard of a parameter sits in the full tensor.
struct ShardMeta {
  std::vector<int64_t> full_shape;
  std::vector<int64_t> shard_shape;
  std::string split;  // "replicated", "rows", "cols", "qkv_rows" (models/layers/params.h ParamSplit)
  int tp_rank = 0;
  int tp = 1;
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

// The bytes of rank_<r>.safetensors for `s`, and the inverse (InputError naming `path`).
std::string serialize_shard(const RankShard& s);
RankShard parse_shard(const std::string& path);

// Writes the checkpoint of `iteration` (collective over host: every rank passes its shard, rank
// 0's run_state is written). Keeps the newest `keep` checkpoints (0: all). Returns the final
// directory. Throws std::runtime_error naming the path on I/O failure.
std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep);

// "" when `path` is a complete checkpoint whose files match metadata.json, else why not,
// naming the file at fault.
std::string verify_checkpoint(const std::string& path);

// The checkpoint to resume from. resume "none": nullopt. "auto": the newest iter_<N> under dir
// that verifies (each one skipped is reported on `err`, naming the file), nullopt when none.
// Anything else is a checkpoint path, which must verify (InputError otherwise).
std::optional<std::string> select_checkpoint(const std::optional<std::string>& dir,
                                             const std::string& resume, std::ostream& err);

struct LoadedCheckpoint {
  std::string path;
  nlohmann::json run_state;
  std::vector<RankShard> shards;  // [saving rank]
};
// Reads every file of a (verified) checkpoint.
LoadedCheckpoint read_checkpoint(const std::string& path);

}  // namespace strata
