// load.h — checking and reading checkpoints (the directory: checkpoint.h).
//
// Reading checks a checkpoint as strictly as a config, before anything of it is used:
//   - metadata.json: format, checksum, iteration (the directory's N), world_size, and exactly
//     one entry (bytes, CRC-32) for run_state.json and for each rank_<r>.safetensors, r <
//     world_size, and at most one for the run's tokenizer (kCheckpointTokenizerFiles): every
//     file a load reads is covered by a checksum;
//   - every file: its size and CRC-32 against its entry (each byte is checksummed as it is read);
//   - run_state.json: every key and its type and range, iteration and world_size equal to
//     metadata.json's, parallel.tensor × pipeline × data = world_size;
//   - each shard: a safetensors header (runtime/io/safetensors.h: dtypes, shapes, offsets tiling
//     the data), F32 vectors named param:/m:/v: inside their shard, meta:<name> entries with
//     shapes of sizes ≥ 0 whose product fits, tp ≥ 1, tp_rank < tp, a shard 1/tp of the full
//     tensor; across the shards one full shape per tensor and every element written once.
// A failure is an InputError naming the file and the key, tensor or byte.
//
// Thread-safety: the functions may run on any threads at once (they share nothing); a
// CheckpointReader is used by one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/checkpoint/shard.h"

namespace strata {

// The names a checkpoint may hold its run's tokenizer under (data.tokenizer, copied by rank 0
// into every save): a Hugging Face tokenizer.json, or a tiktoken ranks file.
inline constexpr const char* kCheckpointTokenizerFiles[] = {"tokenizer.json", "tokenizer.tiktoken"};

// The tokenizer file the checkpoint at `path` holds, its size and CRC-32 checked against
// metadata.json (InputError naming the file when they differ); nullopt when it holds none (a run
// without data.tokenizer, or a checkpoint from before tokenizers were saved).
std::optional<std::string> checkpoint_tokenizer(const std::string& path);

// The checkpoint a command names: `path` itself when it is one (its metadata.json; checked as it
// is read), else the newest iter_<N> under it that verifies (each one skipped reported on `err`);
// InputError naming `path` when it holds none.
std::string checkpoint_or_newest(const std::string& path, std::ostream& err);

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
  std::vector<RankShard> shards;         // [saving rank]
  std::optional<std::string> tokenizer;  // the run's tokenizer file, checked (checkpoint_tokenizer)
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
