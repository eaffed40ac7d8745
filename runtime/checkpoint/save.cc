// save.cc — the collective save protocol of save.h: a temporary directory, every rank's shard
// written and fsync'ed, then rank 0 publishes the checkpoint (metadata.json, the rename,
// latest) once every rank's write is known to have succeeded.
#include "runtime/checkpoint/save.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <thread>

#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/comm/watchdog.h"

namespace strata {
namespace fs = std::filesystem;
using namespace checkpoint_internal;

namespace {

// Keeps the newest `keep` checkpoints under dir (0: all), and always the one just written.
void prune(const std::string& dir, int keep, const std::string& just_written) {
  std::error_code ec;
  // Temporaries are left only by saves that died (saving is collective and ours is done).
  remove_partial_saves(dir);
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

// STRATA_TEST_KILL_DURING_SAVE (checkpoint.h): the save of `iteration` dies on one rank.
void kill_hook(int iteration, int rank, int world) {
  const char* s = std::getenv("STRATA_TEST_KILL_DURING_SAVE");
  if (!s || std::atoi(s) != iteration) return;
  if (rank == (world > 1 ? 1 : 0)) ::raise(SIGKILL);
}

}  // namespace

std::vector<std::string> remove_partial_saves(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool partial = name.rfind("iter_", 0) == 0 && name.find(".tmp-") != std::string::npos;
    if (!partial && name != "latest.tmp") continue;
    fs::remove_all(e.path(), ec);
    if (!ec) removed.push_back(e.path().string());
  }
  return removed;
}

namespace checkpoint_internal {

// Step 1 of a save: rank 0 creates <dir>/iter_<N>.tmp-<random>; every rank learns its name (the
// gather also orders the mkdir before any rank writes). Collective.
std::string make_save_dir(Communicator& host, const std::string& dir,
                          const std::string& final_dir) {
  std::string tmp;
  if (host.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::random_device rd;
    tmp = final_dir + ".tmp-" + crc_hex(rd());
    if (!fs::create_directory(tmp, ec)) io_fail("cannot create directory", tmp);
  }
  return all_gather_strings(host, tmp)[0];
}

// Step 2: this rank's shard into `tmp`, written piece by piece from the shard itself (no second
// copy of GBs of state) and fsync'ed. Returns its metadata.json entry, or {"error": why} when a
// write failed (a full disk). No communication: the background writer thread runs it.
nlohmann::json write_shard(const std::string& tmp, int rank, int world, int iteration,
                           const RankShard& mine) {
  const std::string file = rank_file(rank);
  try {
    if (const char* ms = std::getenv("STRATA_TEST_SLOW_SAVE_MS"))
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
    uint32_t data_crc = 0;
    const std::string header = shard_header(mine, &data_crc);
    std::vector<Chunk> chunks = {{header.data(), header.size()}};
    for (const ShardPiece& p : mine.pieces)
      chunks.push_back(
          {reinterpret_cast<const char*>(p.values.data()), p.values.size() * sizeof(float)});
    size_t bytes = 0;
    write_chunks_synced(tmp + "/" + file, chunks, &bytes);
    kill_hook(iteration, rank, world);
    const uint32_t header_crc = crc32_ieee(header.data(), header.size());
    return {{"file", file},
            {"bytes", bytes},
            {"crc32", crc_hex(crc32_concat(header_crc, data_crc,
                                           static_cast<int64_t>(bytes - header.size())))},
            {"header_bytes", header.size()},
            {"header_crc32", crc_hex(header_crc)}};
  } catch (const std::exception& e) {
    return {{"file", file}, {"error", e.what()}};
  }
}

// Step 3, collective: every rank's entry reaches rank 0, which writes run_state.json and
// metadata.json, renames the directory to iter_<N> (the checkpoint exists from here on),
// replaces latest and prunes. A write that failed on any rank fails the save on every rank
// (std::runtime_error naming the rank's error) after the temporary directory is removed.
std::string publish_save(Communicator& host, const std::string& dir, int iteration,
                         const nlohmann::json& mine, const nlohmann::json& run_state, int keep,
                         const std::string& tmp, const std::string& final_dir,
                         const CheckpointExtras& extras) {
  const int rank = host.rank();
  const std::vector<std::string> entries = all_gather_strings(host, mine.dump());
  try {
    for (size_t r = 0; r < entries.size(); ++r) {
      const nlohmann::json j = nlohmann::json::parse(entries[r]);
      if (j.contains("error"))
        throw std::runtime_error(j.at("error").get<std::string>() + " (rank " + std::to_string(r) +
                                 ")");
    }
    if (rank == 0) {
      nlohmann::json files = nlohmann::json::object();
      for (const std::string& e : entries) {
        nlohmann::json j = nlohmann::json::parse(e);
        const std::string file = j.at("file").get<std::string>();
        j.erase("file");
        files[file] = j;
      }
      const std::string rs = run_state.dump(2) + "\n";
      write_file_synced(tmp + "/run_state.json", rs);
      files["run_state.json"] = {{"bytes", rs.size()},
                                 {"crc32", crc_hex(crc32_ieee(rs.data(), rs.size()))}};
      for (const auto& [name, bytes] : extras) {
        write_file_synced(tmp + "/" + name, bytes);
        files[name] = {{"bytes", bytes.size()},
                       {"crc32", crc_hex(crc32_ieee(bytes.data(), bytes.size()))}};
      }
      const nlohmann::json meta = {{"format", "strata-checkpoint-2"},
                                   {"iteration", iteration},
                                   {"world_size", host.size()},
                                   {"checksum", "crc32-ieee"},
                                   {"files", files}};
      write_file_synced(tmp + "/metadata.json", meta.dump(2) + "\n");
      fsync_dir(tmp);
      exit_if_orphaned();  // and before it publishes the checkpoint
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
  } catch (const std::exception&) {
    // A failed save (a full disk) leaves nothing half-written behind for the next start to trip
    // over; the job ends on the error (the other ranks' files go with the directory).
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (rank == 0) fs::remove(dir + "/latest.tmp", ec);
    throw;
  }
  host.barrier();
  return final_dir;
}

}  // namespace checkpoint_internal

std::string save_checkpoint(Communicator& host, const std::string& dir, int iteration,
                            const RankShard& mine, const nlohmann::json& run_state, int keep,
                            const CheckpointExtras& extras) {
  // A rank whose launcher is gone stops before it writes anything (watchdog.h).
  exit_if_orphaned();
  const std::string final_dir = dir + "/iter_" + std::to_string(iteration);
  const std::string tmp = make_save_dir(host, dir, final_dir);
  const nlohmann::json entry = write_shard(tmp, host.rank(), host.size(), iteration, mine);
  return publish_save(host, dir, iteration, entry, run_state, keep, tmp, final_dir, extras);
}

}  // namespace strata
