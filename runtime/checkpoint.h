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

// The bytes of rank_<r>.safetensors for `s`.
std::string serialize_shard(const RankShard& s);

// Writes the checkpoint of `iteration` (collective over host: every rank passes its shard, rank
// 0's run_state is written). Keeps the newest `keep` checkpoints (0: all). Returns the final
// directory. Throws std::runtime_error naming the path on I/O failure (a full disk), after
// removing the save's temporary directory. A rank whose launcher is gone stops instead of saving
// (watchdog.h exit_if_orphaned).
std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep);

// Removes what saves that did not finish left in `dir` (iter_<N>.tmp-… directories, latest.tmp);
// returns their paths. Rank 0 calls it as a run starts; every save calls it when done.
std::vector<std::string> remove_partial_saves(const std::string& dir);

// Reading checks a checkpoint as strictly as a config, before anything of it is used:
//   - metadata.json: format, checksum, iteration (the directory's N), world_size, and exactly
//     one entry (bytes, CRC-32) for run_state.json and for each rank_<r>.safetensors, r <
//     world_size: every file a load reads is covered by a checksum;
//   - every file: its size and CRC-32 against its entry (each byte is checksummed as it is read);
//   - run_state.json: every key and its type and range, iteration and world_size equal to
//     metadata.json's, parallel.tensor × pipeline × data = world_size;
//   - each shard: a safetensors header (runtime/safetensors.h: dtypes, shapes, offsets tiling
//     the data), F32 vectors named param:/m:/v: inside their shard, meta:<name> entries with
//     shapes of sizes ≥ 0 whose product fits, tp ≥ 1, tp_rank < tp, a shard 1/tp of the full
//     tensor; across the shards one full shape per tensor and every element written once.
// A failure is an InputError naming the file and the key, tensor or byte.

// "" when `path` is a checkpoint that passes every check above, else why not (the InputError's
// "<file>: <where>: <expected>").
std::string verify_checkpoint(const std::string& path);

// The checkpoint to resume from. resume "none": nullopt. "auto": the newest iter_<N> under dir
// that verifies (each one skipped is reported on `err`, naming the file and the key), nullopt
// when none. Anything else is a checkpoint path, which must verify (its InputError otherwise).
std::optional<std::string> select_checkpoint(const std::optional<std::string>& dir,
                                             const std::string& resume, std::ostream& err);

struct LoadedCheckpoint {
  std::string path;
  nlohmann::json run_state;
  std::vector<RankShard> shards;  // [saving rank]
};
// Reads every file of a checkpoint, checking each as verify_checkpoint does (InputError).
LoadedCheckpoint read_checkpoint(const std::string& path);

}  // namespace strata
