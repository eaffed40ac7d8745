// Checkpoint loads at scale (issue 27): each rank reads only what it holds.
//
// Checkpoints are written under several tensor-parallel and ZeRO layouts from values
// that are a closed-form function of (kind, parameter, element of the full tensor); every target
// layout's shard read through CheckpointReader must hold exactly that function of its own
// elements' full indices (padded vocabulary rows zero), and a pipeline stage's load must read
// about its own share of the file, not the checkpoint. A flipped data byte is named by file and
// byte; a checkpoint of the earlier format (whole-file CRC-32s) still loads, to the same values.
// (Background saves: tests/test_checkpoint.cc, AsyncCheckpoint.*.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/model_state.h"
#include "launch/train/trainer.h"
#include "models/layers/embedding.h"
#include "models/registry.h"
#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {
namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("strata_ckio_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---- loading ----

// The value a checkpoint holds for element g of the full tensor `name` of `kind` (its
// tensor_seed): exact in f32.
uint64_t tensor_seed(const std::string& kind, const std::string& name) {
  return std::hash<std::string>()(kind + ":" + name) % 1000;
}
float value_of(uint64_t seed, int64_t g) {
  return static_cast<float>((seed * 7919 + static_cast<uint64_t>(g)) % 9973) * 0.001f + 0.001f;
}

ModelConfig small_gpt(int layers, int hidden, int vocab) {
  ModelConfig mc;
  mc.num_layers = layers;
  mc.hidden_size = hidden;
  mc.num_heads = 4;
  mc.ffn_hidden_size = 4 * hidden;
  mc.seq_len = 16;
  mc.vocab_size = vocab;
  return mc;
}

// Optimizer segments over a layout's flat parameters: with `chunks` > 1 (ZeRO-1 over that many
// data ranks) each parameter split into that many runs, of which data rank `dp` owns one.
std::vector<OptSegment> segments_of(const ParamLayout& l, int chunks, int dp) {
  std::vector<OptSegment> segs;
  int64_t state = 0;
  for (const ParamInfo& p : l.infos()) {
    const int64_t a = p.numel * dp / chunks, b = p.numel * (dp + 1) / chunks;
    if (b > a) segs.push_back({p.offset + a, state, b - a, p.decay});
    state += b - a;
  }
  return segs;
}

// The flat values of `kind` a rank of layout `l` holds, from value_of (padded vocabulary rows
// as a model holds them: zero).
std::vector<float> expected(const ParamLayout& l, const std::string& kind) {
  std::vector<float> v(static_cast<size_t>(l.numel()), 0.0f);
  for (const ParamInfo& p : l.infos()) {
    const uint64_t seed = tensor_seed(kind, p.name);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t g = global_index(p, i, l.tp_rank(), l.tp());
      const bool pad = p.rows_initialised >= 0 && g / p.full_shape[1] >= p.rows_initialised;
      v[static_cast<size_t>(p.offset + i)] = pad ? 0.0f : value_of(seed, g);
    }
  }
  return v;
}

// Writes a checkpoint as a job of tensor size t and data size d (ZeRO-1 when zero) had saved it,
// every rank's shard made by make_rank_shard from value_of: the files, then metadata.json and
// run_state.json (copied from a one-rank checkpoint of the same model and edited).
void write_layout_checkpoint(const std::string& ck, const ModelConfig& mc, int t, int d,
                             bool zero) {
  fs::create_directories(ck);
  nlohmann::json files = nlohmann::json::object();
  for (int r = 0; r < t * d; ++r) {
    const int tp_rank = r % t, dp = r / t;  // tensor ranks consecutive, then data
    const ParamLayout l = model_layout(mc, t, tp_rank, false, whole_model(mc.num_layers));
    const std::vector<float> p = expected(l, "param");
    std::vector<float> m(p.size()), v(p.size());
    const std::vector<OptSegment> segs = segments_of(l, zero ? d : 1, zero ? dp : 0);
    const std::vector<float> em = expected(l, "m"), ev = expected(l, "v");
    for (const OptSegment& g : segs)
      for (int64_t i = 0; i < g.numel; ++i) {
        m[static_cast<size_t>(g.state_offset + i)] = em[static_cast<size_t>(g.param_offset + i)];
        v[static_cast<size_t>(g.state_offset + i)] = ev[static_cast<size_t>(g.param_offset + i)];
      }
    const RankShard s = make_rank_shard(l, p, m, v, segs, Replica{dp, dp}, zero);
    const std::string bytes = serialize_shard(s);
    const std::string file = "rank_" + std::to_string(r) + ".safetensors";
    std::ofstream(ck + "/" + file, std::ios::binary) << bytes;
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    char crc[16], hcrc[16];
    std::snprintf(crc, sizeof crc, "%08x", crc32_ieee(bytes.data(), bytes.size()));
    std::snprintf(hcrc, sizeof hcrc, "%08x", crc32_ieee(bytes.data(), 8 + n));
    files[file] = {
        {"bytes", bytes.size()}, {"crc32", crc}, {"header_bytes", 8 + n}, {"header_crc32", hcrc}};
  }
  const nlohmann::json rs = {
      {"format", "strata-run-state-1"},
      {"iteration", 3},
      {"optimizer_steps", 3},
      {"data_position", 3},
      {"seed", 1},
      {"rng", "none"},
      {"nonfinite_in_a_row", 0},
      {"world_size", t * d},
      {"model", {{"arch", "gpt"}}},
      {"parallel",
       {{"tensor", t},
        {"pipeline", 1},
        {"data", d},
        {"virtual_stages", 1},
        {"schedule", "1f1b"},
        {"sequence_parallel", false},
        {"distributed_optimizer", zero}}},
      {"train", {{"iterations", 3}, {"micro_batch_size", 1}, {"global_batch_size", d}}},
      {"config_file", "test"}};
  const std::string rs_text = rs.dump(2);
  std::ofstream(ck + "/run_state.json") << rs_text;
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", crc32_ieee(rs_text.data(), rs_text.size()));
  files["run_state.json"] = {{"bytes", rs_text.size()}, {"crc32", crc}};
  const nlohmann::json meta = {{"format", "strata-checkpoint-2"},
                               {"iteration", 3},
                               {"world_size", t * d},
                               {"checksum", "crc32-ieee"},
                               {"files", files}};
  std::ofstream(ck + "/metadata.json") << meta.dump(2);
}

// Any saved layout into any target layout: tensor size and rank, a pipeline piece, ZeRO
// segments; every element the closed form says, padded vocabulary rows zero (saved as zero, or
// past the rows a smaller tensor-parallel size saved).
TEST(CheckpointLoad, EveryLayoutReadsExactlyItsOwnElements) {
  const ModelConfig mc = small_gpt(4, 32, 200);  // vocabulary padded to 256 · t/2 … 512
  struct Saved {
    int t, d;
    bool zero;
  };
  for (const Saved& sv : {Saved{1, 1, false}, Saved{2, 2, true}, Saved{4, 1, false}}) {
    const std::string ck = scratch("layout") + "/iter_3";
    write_layout_checkpoint(ck, mc, sv.t, sv.d, sv.zero);
    ASSERT_EQ(verify_checkpoint(ck), "");
    CheckpointReader reader(ck);
    const std::vector<std::vector<ModelPiece>> pieces = {
        whole_model(4), {{0, 2, true, false}}, {{2, 2, false, true}}};
    for (int t : {1, 2, 4})
      for (int r = 0; r < t; ++r)
        for (const auto& piece : pieces)
          for (int chunks : {1, 2}) {
            SCOPED_TRACE("saved t" + std::to_string(sv.t) + " d" + std::to_string(sv.d) +
                         (sv.zero ? " zero" : "") + "; loaded as t" + std::to_string(t) + " rank " +
                         std::to_string(r) + " layers " + std::to_string(piece[0].first_layer) +
                         "+" + std::to_string(piece[0].num_layers) + " state chunks " +
                         std::to_string(chunks));
            const ParamLayout l = model_layout(mc, t, r, false, piece);
            std::vector<float> params(static_cast<size_t>(l.numel()), -1.0f);
            load_params(l, reader, "param", params);
            EXPECT_EQ(params, expected(l, "param"));
            const std::vector<OptSegment> segs = segments_of(l, chunks, chunks - 1);
            const std::vector<float> em = expected(l, "m");
            std::vector<float> want, got;
            for (const OptSegment& g : segs)
              want.insert(want.end(), em.begin() + g.param_offset,
                          em.begin() + g.param_offset + g.numel);
            got.assign(want.size(), -1.0f);
            load_state(l, reader, "m", segs, got);
            EXPECT_EQ(got, want);
          }
    fs::remove_all(fs::path(ck).parent_path());
  }
}

// A pipeline stage of a resharded load reads about its own share of the checkpoint: its
// layers' parameters and moments, plus at most a block at either end of each run of them.
TEST(CheckpointLoad, AStageReadsAboutItsOwnShare) {
  const ModelConfig mc = small_gpt(8, 256, 1024);
  const std::string ck = scratch("share") + "/iter_3";
  write_layout_checkpoint(ck, mc, 1, 1, false);
  const int64_t file = static_cast<int64_t>(fs::file_size(ck + "/rank_0.safetensors"));
  // Stage 1 of 4 at tensor 2, rank 1: layers 2 and 3, a quarter of each of their matrices.
  const ParamLayout l = model_layout(mc, 2, 1, false, {{2, 2, false, false}});
  CheckpointReader reader(ck);
  const int64_t headers = reader.bytes_read();
  std::vector<float> params(static_cast<size_t>(l.numel()));
  load_params(l, reader, "param", params);
  const std::vector<OptSegment> segs = segments_of(l, 1, 0);
  std::vector<float> state(static_cast<size_t>(l.numel()));
  load_state(l, reader, "m", segs, state);
  load_state(l, reader, "v", segs, state);
  EXPECT_EQ(params, expected(l, "param"));
  // Its layers at full width (a column-split shard reads whole rows), three kinds.
  const ParamLayout full = model_layout(mc, 1, 0, false, {{2, 2, false, false}});
  const int64_t own = 3 * full.numel() * 4;
  const int64_t read = reader.bytes_read() - headers;
  std::printf(
      "checkpoint %.1f MB; the stage's layers (param, m, v at full width) %.1f MB; read "
      "%.1f MB (+%.1f KB of headers)\n",
      file / 1e6, own / 1e6, read / 1e6, headers / 1e3);
  EXPECT_LE(read, own + 6 * (int64_t{1} << 20));  // runs of param, m·v: a block at each end
  EXPECT_LT(read, file / 3);
  fs::remove_all(fs::path(ck).parent_path());
}

// A data byte flipped with every whole-file checksum made to agree again: only the block's
// CRC-32 can see it, and the read that uses it is refused naming the file and the block.
TEST(CheckpointLoad, ACorruptedBlockIsNamedByFileAndByte) {
  const ModelConfig mc = small_gpt(2, 32, 64);
  const std::string ck = scratch("block") + "/iter_3";
  write_layout_checkpoint(ck, mc, 1, 1, false);
  const std::string file = ck + "/rank_0.safetensors";
  std::string bytes = slurp(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  bytes[8 + n + 5] = static_cast<char>(bytes[8 + n + 5] ^ 0x40);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  nlohmann::json meta = nlohmann::json::parse(slurp(ck + "/metadata.json"));
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", crc32_ieee(bytes.data(), bytes.size()));
  meta["files"]["rank_0.safetensors"]["crc32"] = crc;
  std::ofstream(ck + "/metadata.json", std::ios::trunc) << meta.dump(2);

  const std::string why = verify_checkpoint(ck);
  EXPECT_NE(why.find("rank_0.safetensors: byte " + std::to_string(8 + n)), std::string::npos)
      << why;
  CheckpointReader reader(ck);  // the header is intact: opening reads no data
  const ParamLayout l = model_layout(mc, 1, 0, false, whole_model(2));
  std::vector<float> params(static_cast<size_t>(l.numel()));
  try {
    load_params(l, reader, "param", params);
    ADD_FAILURE() << "a corrupted block was used";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file + ": byte " + std::to_string(8 + n) + ": a data block of CRC-32"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("(corrupted)"), std::string::npos) << msg;
  }
  fs::remove_all(fs::path(ck).parent_path());
}

Config fuzz_config(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"log.interval=100000", "train.threads=1"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config(std::string(STRATA_TEST_DIR) + "/fuzz/checkpoint/config.json", sets);
}

// The committed checkpoint of the earlier format (tests/fuzz/checkpoint/format1/iter_2, whole-file
// CRC-32s only) and the same checkpoint saved in this one load the same values, and a run resumed
// from either trains the same.
TEST(CheckpointLoad, TheEarlierFormatIsStillRead) {
  const std::string dir = std::string(STRATA_TEST_DIR) + "/fuzz/checkpoint";
  EXPECT_EQ(nlohmann::json::parse(slurp(dir + "/format1/iter_2/metadata.json"))["format"],
            "strata-checkpoint-1");
  EXPECT_EQ(verify_checkpoint(dir + "/format1/iter_2"), "");
  const Config cfg = fuzz_config({});
  const ParamLayout l = model_layout(cfg.model, 1, 0, false, whole_model(cfg.model.num_layers));
  CheckpointReader old_format(dir + "/format1/iter_2"), new_format(dir + "/iter_2");
  for (const char* kind : {"param", "m", "v"}) {
    std::vector<float> a(static_cast<size_t>(l.numel())), b(a.size());
    if (std::string(kind) == "param") {
      load_params(l, old_format, kind, a);
      load_params(l, new_format, kind, b);
    } else {
      load_state(l, old_format, kind, segments_of(l, 1, 0), a);
      load_state(l, new_format, kind, segments_of(l, 1, 0), b);
    }
    EXPECT_EQ(a, b) << kind;
  }
  RunContext ctx;
  ctx.verbose = false;
  const TrainResult r1 = run_training(
      fuzz_config({"checkpoint.resume=" + dir + "/format1/iter_2", "train.iterations=4"}), ctx);
  const TrainResult r2 = run_training(
      fuzz_config({"checkpoint.resume=" + dir + "/iter_2", "train.iterations=4"}), ctx);
  EXPECT_EQ(r1.start_iteration, 2);
  EXPECT_EQ(r1.losses, r2.losses);
  EXPECT_EQ(r1.final_params, r2.final_params);
}

// generate and eval build the model a checkpoint's run_state.json describes: one that does not
// describe its own shards is refused before any memory is allocated for it.
TEST(CheckpointLoad, ARunStateThatDoesNotDescribeItsShardsIsRefused) {
  const std::string dir = std::string(STRATA_TEST_DIR) + "/fuzz/checkpoint/iter_2";
  CheckpointReader reader(dir);
  ModelConfig mc = fuzz_config({}).model;
  EXPECT_NO_THROW(check_checkpoint_holds(model_layout(mc, 1, 0, false, whole_model(1)), reader));
  mc.hidden_size = 1 << 16;
  try {
    check_checkpoint_holds(model_layout(mc, 1, 0, false, whole_model(1)), reader);
    ADD_FAILURE() << "a model the shards do not hold was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/run_state.json: model: a model whose parameters "
                                               "the shards hold"),
              std::string::npos)
        << e.what();
  }
  mc = fuzz_config({}).model;
  mc.num_layers = 0;  // the shards hold h.0.*, which this model does not have
  EXPECT_THROW(check_checkpoint_holds(model_layout(mc, 1, 0, false, whole_model(0)), reader),
               InputError);
}

}  // namespace
}  // namespace strata
