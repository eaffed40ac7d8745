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
// The interface is in three headers, one per job, all included here:
//   shard.h  what a rank saves (RankShard) and the bytes of its file (serialize_shard), CRC-32
//   save.h   writing a checkpoint: save_checkpoint, CheckpointSaver (background saves)
//   load.h   checking and reading one: verify_checkpoint, select_checkpoint, read_checkpoint,
//            CheckpointReader (a rank reading only what it holds)
// Code: shard_format.cc (the shard file's bytes), durable_io.cc (fsync'ed writes), save.cc (the
// collective save protocol), saver.cc (the background writer), manifest.cc (metadata.json and
// run_state.json checked), shard_check.cc (shard headers, data and coverage checked; whole
// reads), reader.cc (CheckpointReader's block cache).
//
// Thread-safety: call from the training thread; saves are collective over `host`.
#pragma once

#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/save.h"
#include "runtime/checkpoint/shard.h"
