// save.h — writing checkpoints (the directory and its crash safety: checkpoint.h).
//
// A save is collective over the ranks of `host`, in three steps (save.cc): rank 0 creates the
// temporary directory; each rank writes and fsyncs its shard (no communication, so a thread may
// do it); the ranks all-gather their shards' sizes and CRC-32s, rank 0 writes run_state.json
// and metadata.json, renames the directory to its final name and replaces `latest`.
//
// Thread-safety: call from the training thread; saves are collective over `host`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/checkpoint/shard.h"
#include "runtime/comm/comm.h"

namespace strata {

// Files rank 0 writes into every checkpoint beside the shards and the run state, name -> bytes:
// the run's tokenizer (kCheckpointTokenizerFiles, load.h). Each is listed in metadata.json with
// its size and CRC-32 and published with the rest; other ranks' extras are ignored.
using CheckpointExtras = std::map<std::string, std::string>;

// Writes the checkpoint of `iteration` (collective over host: every rank passes its shard, rank
// 0's run_state is written). Keeps the newest `keep` checkpoints (0: all). Returns the final
// directory. Throws std::runtime_error naming the path on I/O failure (a full disk), after
// removing the save's temporary directory. A rank whose launcher is gone stops instead of saving
// (watchdog.h exit_if_orphaned).
std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep,
                            const CheckpointExtras& extras = {});

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

  // Rank 0 writes these files into every later save (see CheckpointExtras).
  void set_extras(CheckpointExtras extras) { extras_ = std::move(extras); }

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
  CheckpointExtras extras_;
  int64_t saves_ = 0;
  std::unique_ptr<Pending> pending_;
  double last_write_s_ = 0;
};

// Removes what saves that did not finish left in `dir` (iter_<N>.tmp-… directories, latest.tmp);
// returns their paths. Rank 0 calls it as a run starts; every save calls it when done.
std::vector<std::string> remove_partial_saves(const std::string& dir);

}  // namespace strata
