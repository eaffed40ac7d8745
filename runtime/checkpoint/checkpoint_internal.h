// checkpoint_internal.h — what the checkpoint's files share among themselves: the names and
// CRC-32 blocks of the format, fsync'ed writes, and the checks reading applies (metadata.json,
// run_state.json, shard headers and data). Not part of the public contract (checkpoint.h and
// the headers it includes); only runtime/checkpoint/*.cc include it.
//
// Errors: reading throws InputError naming the file and the key, tensor or byte (load.h);
// writing throws std::runtime_error naming the path and errno's message (io_fail).
//
// Thread-safety: pure functions and types without shared state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/save.h"
#include "runtime/checkpoint/shard.h"
#include "runtime/comm/comm.h"

namespace strata::checkpoint_internal {

using nlohmann::json;

// ---- the format (shard_format.cc) ----

// Format 2 checks a shard's data in blocks, so that a rank reading only its tensors' byte ranges
// checks every byte it uses: blocks of at least 1 MiB, at most 16384 per file (their CRC-32s
// sit in the shard's header, at most 128 KiB of hexadecimal).
constexpr int64_t kMinBlockBytes = int64_t{1} << 20;
constexpr int64_t kMaxBlocks = 16384;
// Reads stream through buffers of this size.
constexpr int64_t kStreamChunk = int64_t{4} << 20;

int64_t block_bytes_for(int64_t data_bytes);

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

// 8 lowercase hexadecimal digits, as metadata.json and the shard headers write CRC-32s.
std::string crc_hex(uint32_t c);

// The length prefix and JSON header of a shard file (the data follows, piece by piece);
// *data_crc: the CRC-32 of that data, from the same pass that checksums its blocks.
std::string shard_header(const RankShard& s, uint32_t* data_crc = nullptr);

// rank_<r>.safetensors.
std::string rank_file(int r);
// rank_<r>.safetensors → r (as rank_file spells it); -1 for any other name.
int rank_of_file(const std::string& name);
// iter_<N> → N; -1 for any other name (temporaries included).
int iteration_of(const std::string& name);
// The iter_<N> directories under `dir`, oldest first.
std::vector<std::pair<int, std::filesystem::path>> final_checkpoints(const std::string& dir);

// ---- durable writes (durable_io.cc) ----

// Throws std::runtime_error "checkpoint: <what> <path>: <errno's message>".
[[noreturn]] void io_fail(const std::string& what, const std::string& path);

struct Chunk {
  const char* data;
  size_t size;
};

// Writes the chunks to `path` in order and fsyncs it: after this returns the data survives a
// crash. Adds the file's size to *bytes.
void write_chunks_synced(const std::string& path, const std::vector<Chunk>& chunks, size_t* bytes);
void write_file_synced(const std::string& path, const std::string& bytes);
// A rename is durable only once the directory holding it is synced.
void fsync_dir(const std::string& path);

// ---- the save protocol (save.cc: each step's contract; saver.cc runs step 2 on a thread) ----

// Step 1, collective: the temporary directory for `final_dir` (<dir>/iter_<N>), created by rank 0.
std::string make_save_dir(Communicator& host, const std::string& dir, const std::string& final_dir);
// Step 2, no communication: this rank's shard written into `tmp`; its metadata.json entry, or
// {"error": why}.
json write_shard(const std::string& tmp, int rank, int world, int iteration, const RankShard& mine);
// Step 3, collective: the entries gathered, the checkpoint published (or the save failed on
// every rank); returns `final_dir`.
std::string publish_save(Communicator& host, const std::string& dir, int iteration,
                         const json& mine, const json& run_state, int keep, const std::string& tmp,
                         const std::string& final_dir, const CheckpointExtras& extras);

// ---- reading: JSON fields checked as strictly as a config's (manifest.cc) ----

std::string show(const json& v);
// An integer-valued JSON number in [lo, hi] (3.0 counts, 3.5 and 1e300 do not), else
// InputError naming `file` and `key`.
int64_t int_in(const json& v, int64_t lo, int64_t hi, const std::string& file,
               const std::string& key);
const json& field(const json& obj, const std::string& key, const std::string& file,
                  const std::string& prefix);
int64_t int_field(const json& obj, const std::string& key, int64_t lo, int64_t hi,
                  const std::string& file, const std::string& prefix = "");
std::string string_field(const json& obj, const std::string& key, const std::string& file,
                         const std::string& prefix = "");
void expect_string(const json& obj, const std::string& key, const std::string& want,
                   const std::string& file);
// `v` is an object holding exactly `keys` (each one's value is checked by the caller).
void exact_object(const json& v, const std::vector<std::string>& keys, const std::string& file,
                  const std::string& where);

// ---- reading: metadata.json and run_state.json (manifest.cc) ----

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

Manifest read_manifest(const std::string& path);
// The file's size against its record, before a byte of it is believed.
void check_size(const std::string& file, const FileRecord& rec);
void check_crc(const std::string& file, const FileRecord& rec, uint32_t crc);
// run_state.json, every key as saved by launch/train/checkpointing.cc.
json read_run_state(const std::string& path, const Manifest& m);
// The run's tokenizer file beside the shards, its size and CRC-32 checked; nullopt when the
// manifest lists none.
std::optional<std::string> checked_tokenizer(const std::string& path, const Manifest& m);

// ---- reading: the shard files (shard_check.cc) ----

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
void pread_exact(int fd, const std::string& file, int64_t offset, int64_t n, char* out);
// The file opened read-only; InputError naming it when it cannot be.
int open_for_reading(const std::string& file);

// Every rank file's header (their coverage of the tensors is check_coverage's).
std::vector<ShardHeader> read_shard_headers(const std::string& path, const Manifest& m);
// Data block `block` of the file against the CRC-32 its header records.
void check_block(const ShardHeader& h, int64_t block, uint32_t crc);
// Streams the data section, piece by piece in offset order (they tile it), through the file's
// CRC-32 (and format 2's block CRC-32s): every byte is checked as it is read, and with `keep`
// the pieces' values are the bytes that were checked.
void check_shard_data(ShardHeader& h, bool keep);
// Across the rank files: one full shape per tensor, and as many elements written as it has
// (where each lands is the model layer's business: launch/train/model_state.h).
void check_coverage(const std::string& path, const std::vector<ShardHeader>& shards);

}  // namespace strata::checkpoint_internal
