// checkpoint.h — crash-safe checkpoints on disk, independent of the model and of the layout.
//
// A checkpoint is a directory <dir>/iter_<N> holding
//   rank_<r>.safetensors  what world rank r owns, in full-index form: for each parameter it
//                         writes, the shard ("param:<name>"), and the AdamW moments of the
//                         elements whose optimizer state it owns ("m:<name>:<first local
//                         element>", "v:…"); the metadata entry "meta:<name>" says where the
//                         shard sits in the full tensor (full shape, shard shape, split kind,
//                         tensor rank and size), so any layout can rebuild its own shards; and
//                         "crc32_block_bytes" / "crc32_blocks", the CRC-32 of each block of the
//                         data section (1 MiB or more, at most 16384 blocks), so that a rank
//                         that reads only its tensors' byte ranges checks every byte it uses
//   run_state.json        (rank 0) iteration, optimizer steps, data position, seed, model shape,
//                         the parallel layout it was saved under
//   metadata.json         (rank 0) format "strata-checkpoint-2": byte size and CRC-32 of every
//                         other file, and of each shard's header (the bytes before its data)
// Nothing else carries state: sampling is a pure function of (seed, split, iteration, slot) and
// the model has no dropout randomness in use, so no RNG state is saved beyond the seed.
// Checkpoints of format "strata-checkpoint-1" (whole-file CRC-32s only) are still read; their
// shards are checksummed whole, streaming, before any value is used.
//
// Crash safety: everything is written into <dir>/iter_<N>.tmp-<random>, each file fsync'ed; all
// ranks meet (all-gather of the shard checksums) before rank 0 writes metadata.json, renames the
// directory to iter_<N> (atomic on POSIX), fsyncs <dir>, then replaces <dir>/latest (written as
// latest.tmp, renamed). A directory is loadable only under its final name and only when every
// file matches metadata.json, so a kill at any point leaves either the previous checkpoints or
// the new one complete. A background save (CheckpointSaver) follows the same steps; only the
// shard writes move to a thread, so the same holds while it writes.
//
// Test hook: STRATA_TEST_KILL_DURING_SAVE=<N> makes world rank 1 (rank 0 in a one-rank run)
// SIGKILL itself after writing its shard of iteration N, before the rename (in the background
// writer when the save is one). STRATA_TEST_SLOW_SAVE_MS=<ms> makes every shard write sleep that
// long first (tests of background saves that must overlap training).
//
// Thread-safety: call from the training thread; saves are collective over `host`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"

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

// A run's saves. Synchronous (background false): save() writes and publishes the checkpoint
// before it returns, as save_checkpoint. Background (checkpoint.async): save() creates the
// temporary directory (collective), hands this rank's snapshot to a writer thread and returns;
// the training thread goes on while the shard is written and fsync'ed. The save is published —
// the all-gather of the shards' checksums, metadata.json, the rename, latest — by publish(), a
// collective every rank calls at the same point once every rank's write is done (the trainer
// learns that without a barrier, through the stop request's per-iteration exchange:
// launch/train/stop_request.h), or by finish() before the run ends. A save waits for the one
// before it (at most one snapshot in memory; saves publish in order). A failed write fails the
// save on every rank at its publish (std::runtime_error), the temporary directory removed.
//
// Thread-safety: call from the training thread only. The writer thread touches only its
// snapshot and its files; it never communicates.
class CheckpointSaver {
 public:
  CheckpointSaver(Communicator& host, std::string dir, int keep, bool background);
  ~CheckpointSaver();  // joins a running write; an unpublished save stays a temporary directory
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Collective. Publishes a pending save first, then saves `iteration`: returns the published
  // directory (synchronous), or "" (background: publish() returns it later).
  std::string save(int iteration, RankShard mine, nlohmann::json run_state);
  // The save started and not yet published: its number (saves count from 0), else -1.
  int64_t pending() const;
  // Whether this rank's writer thread is still writing the pending save.
  bool writing() const;
  // Collective: publishes pending save number `save`, waiting for this rank's write if it is
  // still running; returns its directory, "" when `save` is not the pending one.
  std::string publish(int64_t save);
  // Collective: publishes the pending save, if any. Call before the run ends.
  std::string finish() { return publish(pending()); }
  // Seconds the last published save's shard write took on this rank (in the background or not).
  double last_write_s() const { return last_write_s_; }

 private:
  struct Pending;
  Communicator& host_;
  std::string dir_;
  int keep_;
  bool background_;
  int64_t saves_ = 0;
  std::unique_ptr<Pending> pending_;
  double last_write_s_ = 0;
};

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
//   - each shard: a safetensors header (runtime/io/safetensors.h: dtypes, shapes, offsets tiling
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
// Reads every file of a checkpoint, checking each as verify_checkpoint does (InputError): the
// whole checkpoint in memory (export; a rank resuming reads through CheckpointReader instead).
LoadedCheckpoint read_checkpoint(const std::string& path);

// One run of consecutive elements of a saving rank's shard, as its file's header places it.
struct PieceLocation {
  int rank = 0;             // the saving rank: rank_<rank>.safetensors
  std::string kind;         // "param", "param_prev", "m", "v"
  std::string name;         // the parameter
  int64_t local_begin = 0;  // its first element in the saver's shard
  int64_t count = 0;        // elements
  int64_t data_offset = 0;  // bytes into the file's data section
};

// A checkpoint opened for one rank to read only what it holds. Opening checks everything
// verify_checkpoint does but the tensors' bytes: metadata.json, run_state.json, every shard's
// header (against the CRC-32 metadata.json records for it) and the coverage across the files;
// format 1 shards, whose headers no checksum of their own covers, are checksummed whole
// (streaming) as they open. read() then reads the blocks of the data section that hold the
// requested elements and checks each against its CRC-32 before a value is used. Memory: the
// headers, and one block per open file (8 files at most).
//
// Thread-safety: one reader per thread.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);  // InputError naming the file and key
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const nlohmann::json& run_state() const { return run_state_; }
  // Where saving rank `rank`'s shard of `name` sits in the full tensor (nullptr: not in its file).
  const ShardMeta* meta(int rank, const std::string& name) const;
  // Every piece of kind:name over the rank files, in rank order; empty when none was saved.
  const std::vector<PieceLocation>& pieces(const std::string& kind, const std::string& name) const;
  bool has(const std::string& kind) const;
  // The names of the parameters with pieces of `kind`, sorted.
  std::vector<std::string> names(const std::string& kind) const;
  // Values [first, first + n) of `piece` (first counted from the piece's start) into `out`.
  // InputError naming the file and byte offset of a block whose CRC-32 does not match.
  void read(const PieceLocation& piece, int64_t first, int64_t n, float* out);
  // Bytes read from the rank files so far (headers and data blocks).
  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct File;
  File& open(int rank);
  const std::vector<char>& block(File& f, int64_t index);

  std::string path_;
  nlohmann::json run_state_;
  int format_ = 2;
  std::vector<std::unique_ptr<File>> files_;                  // [saving rank]
  std::map<std::string, std::vector<PieceLocation>> pieces_;  // [kind:name]
  int64_t bytes_read_ = 0;
  uint64_t uses_ = 0;
};

}  // namespace strata
