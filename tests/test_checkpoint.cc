// Checkpoints in one process (issue 8): a resumed run's losses and parameters are bit-identical
// to the uninterrupted run's (the expected values come from the run that never stopped); a
// checkpoint with a flipped byte or a truncated file is named on stderr and the previous one is
// used; a temporary directory is never loaded; only the newest checkpoint.keep remain; a config
// with another model shape is refused naming the keys (exit 2 from the binary); CRC-32 against
// its published check value; export → init_from gives back the exact parameters; background saves
// (checkpoint.async) write the same files, resume exactly, overlap training and publish in order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>

#include "launch/commands/export.h"
#include "launch/config/config_parse.h"
#include "launch/train/model_state.h"
#include "launch/train/trainer.h"
#include "models/gpt/gpt.h"
#include "models/transformer/lm_head.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/dir_lock.h"
#include "runtime/io/safetensors.h"
#include "small_disk.h"

namespace strata {
namespace {
namespace fs = std::filesystem;

constexpr int kIters = 8;

std::string scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("strata_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

Config tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> s = {"model.preset=tiny",
                                "train.threads=1",
                                "train.eval_interval=0",
                                "log.interval=100000",
                                "train.micro_batch_size=2",
                                "train.global_batch_size=4",
                                "train.iterations=" + std::to_string(kIters),
                                "optimizer.lr=3e-3",
                                "optimizer.warmup_iters=2"};
  s.insert(s.end(), extra.begin(), extra.end());
  return load_config("", s);
}

TrainResult train(const std::vector<std::string>& extra) {
  RunContext c;
  c.verbose = false;
  return run_training(tiny(extra), c);
}

std::vector<std::string> ckpt(const std::string& dir, int interval, int keep = 3) {
  return {"checkpoint.dir=" + dir, "checkpoint.interval=" + std::to_string(interval),
          "checkpoint.keep=" + std::to_string(keep)};
}

// The uninterrupted run, the reference every resumed run must equal bit for bit.
const TrainResult& reference() {
  static const TrainResult r = train({});
  return r;
}

void expect_continues_reference(const TrainResult& r, int from) {
  const TrainResult& ref = reference();
  ASSERT_EQ(r.start_iteration, from);
  ASSERT_EQ(r.losses.size(), static_cast<size_t>(kIters - from));
  for (size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_EQ(r.losses[i], ref.losses[static_cast<size_t>(from) + i])
        << "iteration " << from + 1 + i;
  EXPECT_EQ(r.final_params, ref.final_params);
}

TEST(Checkpoint, Crc32MatchesTheStandardCheckValue) {
  // The CRC-32/ISO-HDLC check value of "123456789" (the catalogue of parametrised CRCs).
  EXPECT_EQ(crc32_ieee("123456789", 9), 0xCBF43926u);
}

TEST(Checkpoint, ResumeIsBitIdenticalToTheUninterruptedRun) {
  const std::string dir = scratch("resume");
  const TrainResult full = train(ckpt(dir, 4));
  EXPECT_EQ(full.losses, reference().losses) << "saving must not change the run";
  ASSERT_TRUE(fs::exists(dir + "/iter_4/metadata.json"));
  ASSERT_TRUE(fs::exists(dir + "/iter_8/run_state.json"));
  std::ifstream latest(dir + "/latest");
  std::string line;
  std::getline(latest, line);
  EXPECT_EQ(line, "iter_8");
  fs::remove_all(dir + "/iter_8");  // as if the job had died during iterations 5..8
  expect_continues_reference(train(ckpt(dir, 4)), 4);
  fs::remove_all(dir);
}

// One run per checkpoint directory: while a run holds it (here a lock this process holds, as
// another run's would be), a second run is refused naming the holder's host and pid (before, the
// two ran and corrupted each other's saves); once it is released, the run goes ahead.
TEST(Checkpoint, ASecondRunOnTheSameDirectoryIsRefused) {
  const std::string dir = scratch("locked");
  fs::create_directories(dir);
  {
    const DirLock other(dir);
    try {
      train(ckpt(dir, 4));
      ADD_FAILURE() << "a second run used a locked checkpoint directory";
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), dir + "/.strata.lock");
      EXPECT_EQ(e.where(), "checkpoint.dir");
      EXPECT_NE(std::string(e.what()).find(" " + std::to_string(::getpid())), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(DirLock{dir}, InputError);
  }
  const TrainResult r = train(ckpt(dir, 4));
  EXPECT_EQ(r.losses, reference().losses);
  EXPECT_NO_THROW(DirLock{dir});  // released when the run ended
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptedOrTruncatedFileFallsBackToThePreviousCheckpoint) {
  const std::string dir = scratch("corrupt");
  train(ckpt(dir, 4));
  {  // flip one byte in the middle of iteration 8's shard
    std::fstream f(dir + "/iter_8/rank_0.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff mid = f.tellg() / 2;
    f.seekg(mid);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(mid);
    f.write(&c, 1);
  }
  testing::internal::CaptureStderr();
  TrainResult r = train({"checkpoint.dir=" + dir, "checkpoint.interval=0"});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("iter_8/rank_0.safetensors"), std::string::npos) << err;
  expect_continues_reference(r, 4);

  // Truncated: the previous (valid) checkpoint again.
  train(ckpt(dir, 4));  // rewrites iteration 8
  fs::resize_file(dir + "/iter_8/run_state.json", 10);
  testing::internal::CaptureStderr();
  r = train({"checkpoint.dir=" + dir, "checkpoint.interval=0"});
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("iter_8/run_state.json"), std::string::npos) << err;
  EXPECT_EQ(r.start_iteration, 4);
  fs::remove_all(dir);
}

// An explicit checkpoint.resume path must be valid: no silent fallback, an InputError naming
// the file at fault.
TEST(Checkpoint, InvalidExplicitResumePathIsRefused) {
  const std::string dir = scratch("explicit");
  train(ckpt(dir, 4));
  fs::resize_file(dir + "/iter_4/rank_0.safetensors", 100);
  try {
    train({"checkpoint.resume=" + dir + "/iter_4"});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("iter_4/rank_0.safetensors"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// ---- checkpoints whose checksums hold but whose fields do not (issue 28) ----

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

nlohmann::json json_of(const std::string& path) {
  return nlohmann::json::parse(slurp(path));
}

void write_json(const std::string& path, const nlohmann::json& j) {
  spit(path, j.dump(2) + "\n");
}

std::string crc_hex(const std::string& bytes) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", crc32_ieee(bytes.data(), bytes.size()));
  return crc;
}

// Records `file`'s present size and CRC-32 in metadata.json (a shard's also its header's), as a
// save would have: the edit is then invisible to the checksums.
void rerecord(const std::string& ck, const std::string& file) {
  const std::string bytes = slurp(ck + "/" + file);
  nlohmann::json meta = json_of(ck + "/metadata.json");
  nlohmann::json entry = {{"bytes", bytes.size()}, {"crc32", crc_hex(bytes)}};
  if (file != "run_state.json") {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    entry["header_bytes"] = 8 + n;
    entry["header_crc32"] = crc_hex(bytes.substr(0, 8 + n));
  }
  meta["files"][file] = entry;
  write_json(ck + "/metadata.json", meta);
}

// Edits a rank file's safetensors header (the data stays), then rerecords it.
void edit_header(const std::string& ck, const std::string& file,
                 const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = slurp(ck + "/" + file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  edit(h);
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t m = header.size();
  spit(ck + "/" + file,
       std::string(reinterpret_cast<const char*>(&m), 8) + header + bytes.substr(8 + n));
  rerecord(ck, file);
}

void edit_run_state(const std::string& ck, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json rs = json_of(ck + "/run_state.json");
  edit(rs);
  write_json(ck + "/run_state.json", rs);
  rerecord(ck, "run_state.json");
}

// Rewrites a one-rank checkpoint as two ranks had saved it (full-index form: the tensors named
// after the middle one move to rank_1.safetensors): a valid checkpoint of world size 2.
void split_into_two_ranks(const std::string& ck) {
  const LoadedCheckpoint c = read_checkpoint(ck);
  ASSERT_EQ(c.shards.size(), 1u);
  const RankShard& all = c.shards[0];
  const std::string middle = std::next(all.meta.begin(), all.meta.size() / 2)->first;
  RankShard parts[2];
  for (const ShardPiece& p : all.pieces) {
    RankShard& to = parts[p.name < middle ? 0 : 1];
    to.meta[p.name] = all.meta.at(p.name);
    to.pieces.push_back(p);
  }
  for (int r = 0; r < 2; ++r) {
    const std::string file = "rank_" + std::to_string(r) + ".safetensors";
    spit(ck + "/" + file, serialize_shard(parts[r]));
    rerecord(ck, file);
  }
  nlohmann::json meta = json_of(ck + "/metadata.json");
  meta["world_size"] = 2;
  write_json(ck + "/metadata.json", meta);
  edit_run_state(ck, [](nlohmann::json& rs) {
    rs["world_size"] = 2;
    rs["parallel"]["data"] = 2;
  });
}

// Flips a bit of the first float of rank_1's data: a corruption the checksum would catch.
void corrupt_rank1_data(const std::string& ck) {
  std::string bytes = slurp(ck + "/rank_1.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  bytes[8 + n + 3] = static_cast<char>(bytes[8 + n + 3] ^ 0x20);  // the exponent: a large change
  spit(ck + "/rank_1.safetensors", bytes);
}

// The first tensor of a header (not __metadata__), in offset order.
std::string first_tensor(const nlohmann::json& h) {
  std::string name;
  int64_t at = -1;
  for (const auto& [k, v] : h.items())
    if (k != "__metadata__" && (at < 0 || v["data_offsets"][0].get<int64_t>() < at)) {
      name = k;
      at = v["data_offsets"][0].get<int64_t>();
    }
  return name;
}

// Edits the first parameter's meta entry (JSON inside a metadata string) of rank 0's shard.
void edit_first_meta(const std::string& ck, const std::function<void(nlohmann::json&)>& edit) {
  edit_header(ck, "rank_0.safetensors", [&](nlohmann::json& h) {
    for (auto& [k, v] : h["__metadata__"].items()) {
      if (k.rfind("meta:", 0) != 0) continue;
      nlohmann::json m = nlohmann::json::parse(v.get<std::string>());
      edit(m);
      v = m.dump();
      break;
    }
  });
}

struct BadCheckpoint {
  const char* what;
  std::function<void(const std::string& ck)> make;
  std::vector<std::string> named;  // what the message must name: the file, then the key
};

// Every field a load reads is checked: with the checksums made to agree (or a file that no
// checksum covers), a bad field in iteration 8's checkpoint makes resume fall back to iteration
// 4 with a warning naming the file and the key, and an explicit load (export) refuse it with an
// InputError naming both (the binary: exit status 2, one line).
TEST(Checkpoint, FieldsAreCheckedAsStrictlyAsAConfig) {
  const auto list_file = [](const std::string& ck, const std::string& name) {
    nlohmann::json meta = json_of(ck + "/metadata.json");
    meta["files"][name] = {{"bytes", 5}, {"crc32", "0000abcd"}};
    write_json(ck + "/metadata.json", meta);
  };
  const std::vector<BadCheckpoint> cases = {
      {"a tokenizer listed in metadata.json but missing",
       [&](const std::string& ck) { list_file(ck, "tokenizer.json"); },
       {"iter_8/tokenizer.json", "metadata.json lists it"}},
      {"two tokenizers listed",
       [&](const std::string& ck) {
         list_file(ck, "tokenizer.json");
         list_file(ck, "tokenizer.tiktoken");
       },
       {"iter_8/metadata.json", "files.tokenizer.tiktoken", "one tokenizer"}},
      {"a file metadata.json may not list",
       [&](const std::string& ck) { list_file(ck, "vocab.txt"); },
       {"iter_8/metadata.json", "files.vocab.txt", "tokenizer.json or tokenizer.tiktoken"}},
      {"a rank's shard not covered by metadata.json, and corrupted",
       [](const std::string& ck) {
         nlohmann::json meta = json_of(ck + "/metadata.json");
         meta["files"].erase("rank_1.safetensors");
         write_json(ck + "/metadata.json", meta);
         corrupt_rank1_data(ck);
       },
       {"iter_8/metadata.json", "files", "rank_1.safetensors"}},
      {"world_size 1 in metadata.json with rank_1's shard deleted",
       [](const std::string& ck) {
         nlohmann::json meta = json_of(ck + "/metadata.json");
         meta["world_size"] = 1;
         meta["files"].erase("rank_1.safetensors");
         write_json(ck + "/metadata.json", meta);
         fs::remove(ck + "/rank_1.safetensors");
       },
       {"iter_8/run_state.json", "world_size"}},
      {"world_size 1 in both files with rank_1's shard deleted",
       [](const std::string& ck) {
         nlohmann::json meta = json_of(ck + "/metadata.json");
         meta["world_size"] = 1;
         meta["files"].erase("rank_1.safetensors");
         write_json(ck + "/metadata.json", meta);
         fs::remove(ck + "/rank_1.safetensors");
         edit_run_state(ck, [](nlohmann::json& rs) { rs["world_size"] = 1; });
       },
       {"iter_8/run_state.json", "parallel", "world_size 1"}},
      {"iteration -3",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs["iteration"] = -3; });
       },
       {"iter_8/run_state.json", "iteration", "-3"}},
      {"iteration 1e12",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs["iteration"] = 1e12; });
       },
       {"iter_8/run_state.json", "iteration"}},
      {"iteration 1000000000000 (an integer past int)",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs["iteration"] = int64_t{1000000000000}; });
       },
       {"iter_8/run_state.json", "iteration", "1000000000000"}},
      {"iteration \"x\"",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs["iteration"] = "x"; });
       },
       {"iter_8/run_state.json", "iteration", "\"x\""}},
      {"iteration 7 in a directory named iter_8",
       [](const std::string& ck) {
         nlohmann::json meta = json_of(ck + "/metadata.json");
         meta["iteration"] = 7;
         write_json(ck + "/metadata.json", meta);
       },
       {"iter_8/metadata.json", "iteration"}},
      {"optimizer_steps -1",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs["optimizer_steps"] = -1; });
       },
       {"iter_8/run_state.json", "optimizer_steps"}},
      {"nonfinite_in_a_row \"many\"",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs["nonfinite_in_a_row"] = "many"; });
       },
       {"iter_8/run_state.json", "nonfinite_in_a_row"}},
      {"run_state.json missing its model",
       [](const std::string& ck) {
         edit_run_state(ck, [](nlohmann::json& rs) { rs.erase("model"); });
       },
       {"iter_8/run_state.json", "model"}},
      {"a negative dimension in a shard's full_shape",
       [](const std::string& ck) {
         edit_first_meta(ck, [](nlohmann::json& m) {
           m["full_shape"][0] = -m["full_shape"][0].get<int64_t>();
           m["shard_shape"][0] = -m["shard_shape"][0].get<int64_t>();
         });
       },
       {"iter_8/rank_0.safetensors", "full_shape"}},
      {"a negative dimension in a tensor's shape",
       [](const std::string& ck) {
         edit_header(ck, "rank_0.safetensors", [](nlohmann::json& h) {
           auto& shape = h[first_tensor(h)]["shape"];
           shape[0] = -shape[0].get<int64_t>();
         });
       },
       {"iter_8/rank_0.safetensors", "tensor "}},
      {"a shard_shape that is not 1/tp of its full_shape",
       [](const std::string& ck) {
         edit_first_meta(ck, [](nlohmann::json& m) {
           m["full_shape"][0] = 2 * m["full_shape"][0].get<int64_t>();
         });
       },
       {"iter_8/rank_0.safetensors", "__metadata__.meta:"}},
      {"a shape whose product overflows",
       [](const std::string& ck) {
         edit_first_meta(ck, [](nlohmann::json& m) {
           m["full_shape"] = {int64_t{1} << 40, int64_t{1} << 40};
         });
       },
       {"iter_8/rank_0.safetensors", "full_shape", "64 bits"}},
      {"overlapping data_offsets",
       [](const std::string& ck) {
         edit_header(ck, "rank_0.safetensors", [](nlohmann::json& h) {
           // The second tensor in offset order starts 4 bytes early; the file still ends where
           // the last one does.
           std::string second;
           for (const auto& [k, v] : h.items())
             if (k != "__metadata__" &&
                 v["data_offsets"][0] == h[first_tensor(h)]["data_offsets"][1])
               second = k;
           auto& off = h[second]["data_offsets"];
           off = {off[0].get<int64_t>() - 4, off[1].get<int64_t>() - 4};
         });
       },
       {"iter_8/rank_0.safetensors", "data_offsets"}},
      {"a tensor of dtype I32",
       [](const std::string& ck) {
         edit_header(ck, "rank_0.safetensors",
                     [](nlohmann::json& h) { h[first_tensor(h)]["dtype"] = "I32"; });
       },
       {"iter_8/rank_0.safetensors", "tensor ", "F32"}},
      {"a moment's offset past its shard",
       [](const std::string& ck) {
         edit_header(ck, "rank_0.safetensors", [](nlohmann::json& h) {
           for (const auto& [k, v] : h.items())
             if (k.rfind("m:", 0) == 0) {
               h[k.substr(0, k.rfind(':')) + ":999999999"] = v;
               h.erase(k);
               break;
             }
         });
       },
       {"iter_8/rank_0.safetensors", "tensor m:"}},
  };
  const std::string base = scratch("fields");
  train(ckpt(base, 4));
  split_into_two_ranks(base + "/iter_8");
  {  // the split checkpoint itself is valid: resume continues from it
    const std::string dir = scratch("fields_ok");
    fs::copy(base, dir, fs::copy_options::recursive);
    expect_continues_reference(train({"checkpoint.dir=" + dir, "checkpoint.interval=0"}), 8);
    fs::remove_all(dir);
  }
  for (const BadCheckpoint& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string dir = scratch("fields_case");
    fs::copy(base, dir, fs::copy_options::recursive);
    c.make(dir + "/iter_8");
    const auto names_all = [&](const std::string& msg) {
      for (const std::string& n : c.named)
        if (msg.find(n) == std::string::npos) return false;
      return true;
    };

    testing::internal::CaptureStderr();
    const TrainResult r = train({"checkpoint.dir=" + dir, "checkpoint.interval=0"});
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.start_iteration, 4) << "resume must fall back to iter_4";
    EXPECT_NE(err.find("warning: skipping checkpoint " + dir + "/iter_8: "), std::string::npos)
        << err;
    EXPECT_TRUE(names_all(err)) << err;

    try {
      export_checkpoint(dir + "/iter_8", dir + "/out.safetensors");
      ADD_FAILURE() << "export accepted it";
    } catch (const InputError& e) {
      EXPECT_TRUE(names_all(e.what())) << e.what();
    }
    const std::string cmd = std::string(STRATA_BIN_PATH) + " export --checkpoint " + dir +
                            "/iter_8 --out " + dir + "/out.safetensors 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[1024];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int status = ::pclose(p);
    std::printf("%s:\n  resume: %s  export: %s", c.what, err.c_str(), out.c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_EQ(out.rfind("error: " + dir + "/iter_8/", 0), 0u) << out;
    fs::remove_all(dir);
  }
  fs::remove_all(base);
}

// ---- a full disk (issue 28) ----

std::vector<std::string> partial_saves(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp-") != std::string::npos || name == "latest.tmp") v.push_back(name);
  }
  return v;
}

// A save on a full disk fails naming the file and the system's reason, and leaves no partial
// directory behind: reruns do not pile them up (each added one before).
TEST(Checkpoint, AFailedSaveLeavesNoPartialDirectory) {
  testdisk::SmallDisk disk("1m");  // a checkpoint of the tiny model is 1.36 MB
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  const std::string dir = disk.path() + "/ckpt";
  for (int run = 0; run < 3; ++run) {
    try {
      train(ckpt(dir, 4));
      ADD_FAILURE() << "a save on a full disk succeeded";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(dir + "/iter_4.tmp-"), std::string::npos) << msg;
      EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    }
    EXPECT_EQ(partial_saves(dir), std::vector<std::string>{}) << "after run " << run + 1;
  }
  // The binary: exit status 1, the rank and the failed write.
  const std::string config = scratch("full_disk_config.json");
  std::ofstream(config) << "{\"model\": {\"preset\": \"tiny\"}}";
  const std::string cmd = std::string(STRATA_BIN_PATH) + " train --config " + config +
                          " --set train.iterations=4 --set checkpoint.interval=4 --set "
                          "checkpoint.dir=" +
                          dir + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[1024];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  fs::remove(config);
  const size_t at = out.find("[rank");
  if (at != std::string::npos) std::printf("%s\n", out.substr(at, out.find('\n', at) - at).c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("[rank 0 host "), std::string::npos) << out;
  EXPECT_NE(out.find("error: checkpoint: cannot write " + dir), std::string::npos) << out;
  EXPECT_EQ(partial_saves(dir), std::vector<std::string>{});
}

// What saves that died left (a kill between mkdir and rename) is removed as the next run starts,
// each one named on stderr.
TEST(Checkpoint, PartialSavesAreRemovedAtStart) {
  const std::string dir = scratch("partial");
  fs::create_directories(dir + "/iter_4.tmp-0badf00d");
  std::ofstream(dir + "/iter_4.tmp-0badf00d/rank_0.safetensors") << "half a shard";
  fs::create_directories(dir + "/iter_8.tmp-12345678");
  std::ofstream(dir + "/latest.tmp") << "iter_";
  testing::internal::CaptureStderr();
  train({"checkpoint.dir=" + dir, "checkpoint.interval=0"});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(partial_saves(dir), std::vector<std::string>{});
  for (const char* name : {"iter_4.tmp-0badf00d", "iter_8.tmp-12345678", "latest.tmp"})
    EXPECT_NE(err.find("warning: removed " + dir + "/" + name), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(Checkpoint, TemporaryDirectoryIsNeverLoaded) {
  const std::string dir = scratch("tmp");
  train(ckpt(dir, 4));
  // A complete, checksum-valid directory that never got its final name (killed before rename).
  fs::rename(dir + "/iter_8", dir + "/iter_8.tmp-0badf00d");
  const TrainResult r = train({"checkpoint.dir=" + dir, "checkpoint.interval=0"});
  EXPECT_EQ(r.start_iteration, 4);
  fs::remove_all(dir);
}

TEST(Checkpoint, KeepsOnlyTheNewest) {
  const std::string dir = scratch("keep");
  train(ckpt(dir, 1, 2));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // (.strata.lock: the run's lock of the directory, dir_lock.h.)
  EXPECT_EQ(names, (std::vector<std::string>{".strata.lock", "iter_7", "iter_8", "latest"}));
  fs::remove_all(dir);
}

// Issue 28: checkpoint.keep 0 keeps every checkpoint (docs/checkpoints.md); the parser used to
// refuse it.
TEST(Checkpoint, KeepZeroKeepsAll) {
  const std::string dir = scratch("keep0");
  train(ckpt(dir, 2, 0));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".strata.lock", "iter_2", "iter_4", "iter_6", "iter_8",
                                             "latest"}));
  fs::remove_all(dir);
}

TEST(Checkpoint, ResumeNoneStartsFresh) {
  const std::string dir = scratch("none");
  train(ckpt(dir, 4));
  const TrainResult r = train({"checkpoint.dir=" + dir, "checkpoint.resume=none"});
  EXPECT_EQ(r.start_iteration, 0);
  EXPECT_EQ(r.losses, reference().losses);
  fs::remove_all(dir);
}

TEST(Checkpoint, MismatchedModelShapeIsRefusedNamingTheKeys) {
  const std::string dir = scratch("mismatch");
  train(ckpt(dir, 4));
  try {
    train({"checkpoint.dir=" + dir, "model.hidden_size=32", "model.ffn_hidden_size=128"});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ffn_hidden_size"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("num_layers"), std::string::npos) << msg;
  }
  // The binary: exit status 2 and one error line naming the key.
  std::ofstream(dir + "/config.json") << "{\"model\": {\"preset\": \"tiny\"}}\n";
  const std::string cmd = std::string(STRATA_BIN_PATH) + " train --config " + dir +
                          "/config.json --set "
                          "model.hidden_size=32 --set model.ffn_hidden_size=128 --set "
                          "checkpoint.dir=" +
                          dir + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("hidden_size"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(Checkpoint, ExportThenInitFromGivesBackTheParameters) {
  const std::string dir = scratch("export");
  const TrainResult full = train(ckpt(dir, 4));
  const std::string file = dir + "/model.safetensors";
  export_checkpoint(dir, file);
  const StFile f = read_safetensors(file);
  const Config c = tiny({});
  const int64_t V = c.model.vocab_size, C = c.model.hidden_size;
  EXPECT_EQ(f.at("transformer.wte.weight", file).shape, (std::vector<int64_t>{V, C}));
  EXPECT_EQ(f.at("transformer.h.0.attn.c_attn.weight", file).shape,
            (std::vector<int64_t>{C, 3 * C}));
  EXPECT_EQ(f.at("transformer.h.0.mlp.c_proj.weight", file).shape,
            (std::vector<int64_t>{c.model.ffn_hidden_size, C}));
  EXPECT_EQ(f.at("lm_head.weight", file).data, f.at("transformer.wte.weight", file).data);
  const TrainResult r = train({"model.init_from=" + file, "train.iterations=0"});
  EXPECT_EQ(r.final_params, full.final_params);

  // A file for another model shape names the tensor.
  try {
    train({"model.init_from=" + file, "model.hidden_size=32", "model.ffn_hidden_size=128",
           "train.iterations=0"});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// model.init_from takes a Strata checkpoint too (Megatron-LM's --finetune): its weights, and
// nothing else — iteration 0, fresh optimizer moments. A checkpoint.dir gives its newest valid
// checkpoint; a model of another shape names the run state and the key.
TEST(Checkpoint, InitFromAStrataCheckpointTakesItsWeightsAlone) {
  const std::string dir = scratch("init_from");
  const TrainResult full = train(ckpt(dir, 4));
  for (const std::string& from : {dir, dir + "/iter_8"}) {
    const TrainResult r = train({"model.init_from=" + from, "train.iterations=0"});
    EXPECT_EQ(r.start_iteration, 0) << from;
    EXPECT_EQ(r.final_params, full.final_params) << from;
  }
  // Training on from it is training on from the same weights exported to Hugging Face's form:
  // the same losses and weights (fresh moments and data in both).
  const std::string file = dir + "/iter_4.safetensors";
  export_checkpoint(dir + "/iter_4", file);
  const TrainResult tuned = train({"model.init_from=" + dir + "/iter_4", "train.iterations=3"});
  const TrainResult from_hf = train({"model.init_from=" + file, "train.iterations=3"});
  EXPECT_EQ(tuned.start_iteration, 0);
  EXPECT_EQ(tuned.losses, from_hf.losses);
  EXPECT_EQ(tuned.final_params, from_hf.final_params);
  try {
    train({"model.init_from=" + dir, "model.num_layers=3", "train.iterations=0"});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("iter_8/run_state.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_layers"), std::string::npos) << e.what();
  }
  fs::remove_all(dir + "/iter_4");
  fs::resize_file(dir + "/iter_8/run_state.json", 10);
  try {
    train({"model.init_from=" + dir, "train.iterations=0"});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a checkpoint.dir holding a valid checkpoint"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// 2bw keeps two weight versions: its checkpoint holds both (param_prev: W(k−1), on which batch k
// runs), so a resumed run continues bit for bit — losses, norms and final weights.
TEST(Checkpoint, TwoBWResumesBitIdentical) {
  const std::string dir = scratch("2bw");
  const TrainResult full =
      train({"parallel.schedule=2bw", "checkpoint.dir=" + dir, "checkpoint.interval=3"});
  const TrainResult plain = train({"parallel.schedule=2bw"});
  EXPECT_EQ(full.losses, plain.losses) << "saving changed the run";
  const TrainResult resumed =
      train({"parallel.schedule=2bw", "checkpoint.resume=" + dir + "/iter_3"});
  ASSERT_EQ(resumed.start_iteration, 3);
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(kIters - 3));
  for (size_t i = 0; i < resumed.losses.size(); ++i) {
    EXPECT_EQ(resumed.losses[i], full.losses[i + 3]) << "iteration " << i + 4;
    EXPECT_EQ(resumed.grad_norms[i], full.grad_norms[i + 3]) << "iteration " << i + 4;
  }
  EXPECT_EQ(resumed.final_params, full.final_params);
  // Both versions are in the file; without the older one batch 4 would run on W(3), not W(2).
  const StFile f = read_safetensors(dir + "/iter_3/rank_0.safetensors");
  int prev = 0;
  for (const auto& [name, t] : f.tensors) prev += name.rfind("param_prev:", 0) == 0;
  EXPECT_GT(prev, 0);
  fs::remove_all(dir);
}

// The model of tests/golden/hf_gpt2_tiny.safetensors (make_hf_fixture.py's GPT2Config).
// Strata's logits for the exported model against transformers' GPT2LMHeadModel loading the same
// file (tests/golden/make_hf_fixture.py; computed there in float64). Tolerance 1e-4 absolute:
// Strata runs in float32 (about 1e-6 relative per op over two layers of width 32, logits of
// magnitude < 1), far inside it; a wrong layout (an untransposed Conv1D weight, swapped q/k/v)
// moves logits by 1e-2 or more.
TEST(Checkpoint, LogitsMatchHuggingFaceTransformers) {
  const std::string path = std::string(STRATA_TEST_DIR) + "/golden/hf_gpt2_tiny.safetensors";
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path;
  const StFile f = read_safetensors(path);
  FullTensors hf;
  for (const auto& [name, t] : f.tensors)
    if (t.dtype == "F32") hf[name] = {t.shape, t.as_f32()};
  // The model the fixture was exported from (tests/golden/README.md: trained 3 steps with this
  // config by `strata train`, then `strata export`).
  const Config c = load_config(std::string(STRATA_TEST_DIR) + "/golden/hf_tiny_train.json", {});
  const TransformerSpec d = gpt_spec(c.model);
  const VocabShard vocab = vocab_shard(d.V, 1, 0);
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ModelOptions o;
  o.seed = c.train.seed;
  TransformerModel model(d, o, *be);
  std::vector<float> params(static_cast<size_t>(model.params().numel()));
  fill_params(model.params().layout(), gpt_from_hf(c.model, hf, path), params, path);
  be->upload(model.params().params(), params.data());

  const StTensor& tok = f.at("tokens", path);  // (B, S) i32
  const std::vector<int32_t> tokens = tok.as_i32();
  const int B = static_cast<int>(tok.shape[0]), S = static_cast<int>(tok.shape[1]);
  Tensor tt = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  Tensor tg = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  be->upload(tt, tokens.data());
  be->upload(tg, tokens.data());  // targets only feed the loss, unused here
  LossSum loss;
  PieceActsPtr acts = model.forward(ModelBatch{tt, tg, Tensor()}, &loss);
  const Tensor& logits = lm_logits(*acts);  // (B·S, Vp)
  std::vector<float> got(static_cast<size_t>(logits.numel()));
  be->download(got.data(), logits);
  const std::vector<float> want = f.at("logits", path).as_f32();  // (B, S, V)
  ASSERT_EQ(want.size(), static_cast<size_t>(B) * S * d.V);
  double worst = 0;
  for (int64_t r = 0; r < static_cast<int64_t>(B) * S; ++r)
    for (int64_t v = 0; v < d.V; ++v)
      worst = std::max(worst,
                       std::fabs(static_cast<double>(got[static_cast<size_t>(r * vocab.Vp + v)]) -
                                 want[static_cast<size_t>(r * d.V + v)]));
  std::printf("logits vs transformers: max |diff| %.3g over %d tokens\n", worst, B * S);
  EXPECT_LT(worst, 1e-4);
}

// ---- background saves (checkpoint.async) ----

// The background save writes the synchronous save's files, byte for byte, and the run trains
// the same; resumed from it, the run continues the uninterrupted one bit for bit.
TEST(AsyncCheckpoint, SameFilesAsTheSynchronousSaveAndAnExactResume) {
  const std::string sync = scratch("sync"), async = scratch("async");
  const TrainResult a = train({"checkpoint.dir=" + sync, "checkpoint.interval=2"});
  const TrainResult b =
      train({"checkpoint.dir=" + async, "checkpoint.interval=2", "checkpoint.async=true"});
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.final_params, b.final_params);
  ASSERT_EQ(b.save_stall_s.size(), 4u);
  for (int it : {4, 6, 8})
    for (const char* f : {"rank_0.safetensors", "run_state.json", "metadata.json"}) {
      const std::string name = "/iter_" + std::to_string(it) + "/" + f;
      EXPECT_EQ(slurp(sync + name), slurp(async + name)) << name;
      EXPECT_FALSE(slurp(async + name).empty()) << name;
    }
  EXPECT_EQ(slurp(async + "/latest"), "iter_8\n");
  const TrainResult r = train({"checkpoint.resume=" + async + "/iter_4", "checkpoint.async=true"});
  ASSERT_EQ(r.start_iteration, 4);
  EXPECT_EQ(r.losses, std::vector<double>(a.losses.begin() + 4, a.losses.end()));
  EXPECT_EQ(r.final_params, a.final_params);
  fs::remove_all(sync);
  fs::remove_all(async);
}

// With a write that takes 300 ms (STRATA_TEST_SLOW_SAVE_MS), training goes on while it is
// written: the save of iteration 2 is published at a later iteration, never before the write
// ended; a save due while the previous one is still being written waits for it, so every
// checkpoint appears, complete, in order.
TEST(AsyncCheckpoint, TrainingGoesOnWhileTheShardIsWritten) {
  const std::string dir = scratch("slow");
  ::setenv("STRATA_TEST_SLOW_SAVE_MS", "300", 1);
  const TrainResult r = train({"checkpoint.dir=" + dir, "checkpoint.interval=2",
                               "checkpoint.keep=0", "checkpoint.async=true"});
  ::unsetenv("STRATA_TEST_SLOW_SAVE_MS");
  ASSERT_EQ(r.save_published_at.size(), 4u);
  // Taken at 2, 4, 6, 8; the write outlasts the iteration it was taken at.
  EXPECT_GT(r.save_published_at[0], 2);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_GE(r.save_write_s[k], 0.3) << "save " << k;
    EXPECT_GE(r.save_published_at[k], 2 * static_cast<int>(k + 1)) << "save " << k;
    if (k > 0) {
      EXPECT_GE(r.save_published_at[k], r.save_published_at[k - 1]);
    }
  }
  for (int it : {2, 4, 6, 8})
    EXPECT_EQ(verify_checkpoint(dir + "/iter_" + std::to_string(it)), "") << it;
  EXPECT_EQ(slurp(dir + "/latest"), "iter_8\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
