// Hugging Face interop without PyTorch: the Llama adapter's layouts (expected values by index
// arithmetic on the HF side, not by the adapter's own slicing), model directories written and
// read back bit for bit (one file and sharded, huggingface_hub's sharding rule on hand-worked
// sizes), BF16 / F16 reading against bit patterns written by hand, BF16 writing's rounding, and
// every bad input naming its file and key: a missing shard, a tensor missing from its shard, a
// wrong shape, a config.json that disagrees with the model config.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "launch/commands/export.h"
#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "models/gpt/gpt.h"
#include "models/hf_checkpoint.h"
#include "models/layers/embedding.h"
#include "models/llama/llama.h"
#include "runtime/base/error.h"
#include "runtime/io/safetensors.h"

namespace strata {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("strata_hfio_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

// Runs `f`, which must throw InputError; returns its message.
std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InputError";
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A small Llama config: 4 query heads share 2 key/value heads, vocabulary not a multiple of 128.
ModelConfig llama_config(bool tie) {
  ModelConfig m;
  m.arch = "llama";
  m.num_layers = 2;
  m.hidden_size = 16;
  m.num_heads = 4;  // HS = 4
  m.num_key_value_heads = 2;
  m.ffn_hidden_size = 24;
  m.seq_len = 8;
  m.vocab_size = 37;
  m.tie_embeddings = tie;
  m.rope_theta = 500000;
  m.rms_norm_eps = 1e-5;
  return m;
}

// Every element of a tensor distinct: value = id·1e4 + index (exact in f32 for these sizes).
FullTensor numbered(std::vector<int64_t> shape, int id) {
  FullTensor t;
  t.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  t.data.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t.data[static_cast<size_t>(i)] = static_cast<float>(id * 10000 + i);
  return t;
}

// Our full tensors (models/llama parameter names), the vocabulary padded to 128 with zero rows.
FullTensors llama_ours(const ModelConfig& m) {
  const int64_t C = m.hidden_size, HS = C / m.num_heads, F = m.ffn_hidden_size;
  const int64_t Vp = pad_vocab(m.vocab_size, 128), QKV = (m.num_heads + 2 * m.kv_heads()) * HS;
  FullTensors t;
  int id = 1;
  const auto padded = [&](const std::string& name) {
    FullTensor e = numbered({Vp, C}, id++);
    std::fill(e.data.begin() + m.vocab_size * C, e.data.end(), 0.0f);
    t[name] = e;
  };
  padded("embed_tokens");
  for (int l = 0; l < m.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    t[p + "input_layernorm.weight"] = numbered({C}, id++);
    t[p + "self_attn.qkv_proj.weight"] = numbered({QKV, C}, id++);
    t[p + "self_attn.o_proj.weight"] = numbered({C, m.num_heads * HS}, id++);
    t[p + "post_attention_layernorm.weight"] = numbered({C}, id++);
    t[p + "mlp.gate_up_proj.weight"] = numbered({2 * F, C}, id++);
    t[p + "mlp.down_proj.weight"] = numbered({C, F}, id++);
  }
  t["norm.weight"] = numbered({C}, id++);
  if (!m.tie_embeddings) padded("lm_head.weight");
  return t;
}

float at2(const FullTensor& t, int64_t r, int64_t c) {
  return t.data[static_cast<size_t>(r * t.shape[1] + c)];
}

TEST(HfLlama, ToHfSplitsTheFusedWeightsByRow) {
  const ModelConfig m = llama_config(false);
  const FullTensors ours = llama_ours(m);
  const FullTensors hf = llama_to_hf(m, ours);
  const int64_t C = 16, HS = 4, F = 24, V = 37;
  EXPECT_EQ(hf.size(), 2u + 2u * 9u + 1u);  // embed, norm, lm_head, 9 per layer
  EXPECT_EQ(hf.at("model.embed_tokens.weight").shape, (std::vector<int64_t>{V, C}));
  EXPECT_EQ(hf.at("lm_head.weight").shape, (std::vector<int64_t>{V, C}));
  for (int l = 0; l < 2; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".", h = "model." + p;
    const FullTensor& qkv = ours.at(p + "self_attn.qkv_proj.weight");
    const FullTensor& q = hf.at(h + "self_attn.q_proj.weight");
    const FullTensor& k = hf.at(h + "self_attn.k_proj.weight");
    const FullTensor& v = hf.at(h + "self_attn.v_proj.weight");
    ASSERT_EQ(q.shape, (std::vector<int64_t>{4 * HS, C}));
    ASSERT_EQ(k.shape, (std::vector<int64_t>{2 * HS, C}));
    ASSERT_EQ(v.shape, (std::vector<int64_t>{2 * HS, C}));
    // Row r of k is row 16 + r of the fused weight; of v, row 24 + r; no permutation.
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(at2(k, r, c), at2(qkv, 16 + r, c));
        EXPECT_EQ(at2(v, r, c), at2(qkv, 24 + r, c));
      }
    for (int64_t r = 0; r < 16; ++r) EXPECT_EQ(at2(q, r, 3), at2(qkv, r, 3));
    const FullTensor& gu = ours.at(p + "mlp.gate_up_proj.weight");
    const FullTensor& up = hf.at(h + "mlp.up_proj.weight");
    ASSERT_EQ(up.shape, (std::vector<int64_t>{F, C}));
    for (int64_t r = 0; r < F; ++r) {
      EXPECT_EQ(at2(hf.at(h + "mlp.gate_proj.weight"), r, 5), at2(gu, r, 5));
      EXPECT_EQ(at2(up, r, 5), at2(gu, F + r, 5));
    }
    EXPECT_EQ(hf.at(h + "self_attn.o_proj.weight").data,
              ours.at(p + "self_attn.o_proj.weight").data);
    EXPECT_EQ(hf.at(h + "mlp.down_proj.weight").shape, (std::vector<int64_t>{C, F}));
    EXPECT_EQ(hf.at(h + "post_attention_layernorm.weight").data,
              ours.at(p + "post_attention_layernorm.weight").data);
  }
  EXPECT_EQ(at2(hf.at("lm_head.weight"), V - 1, C - 1),
            at2(ours.at("lm_head.weight"), V - 1, C - 1));
}

TEST(HfLlama, RoundTripGivesBackOurTensors) {
  for (bool tie : {false, true}) {
    const ModelConfig m = llama_config(tie);
    const FullTensors ours = llama_ours(m);
    const FullTensors hf = llama_to_hf(m, ours);
    EXPECT_EQ(hf.count("lm_head.weight"), tie ? 0u : 1u) << "a tied model saves no head";
    const FullTensors back = llama_from_hf(m, hf, "x.safetensors");
    ASSERT_EQ(back.size(), ours.size()) << "tie " << tie;
    for (const auto& [name, t] : ours) {
      const FullTensor& b = back.at(name);
      if (name == "embed_tokens" || name == "lm_head.weight") {
        // Unpadded: the first V rows (fill_params zeroes the padding).
        ASSERT_EQ(b.shape, (std::vector<int64_t>{37, 16})) << name;
        EXPECT_TRUE(std::equal(b.data.begin(), b.data.end(), t.data.begin())) << name;
      } else {
        EXPECT_EQ(b.shape, t.shape) << name;
        EXPECT_EQ(b.data, t.data) << name;
      }
    }
  }
}

TEST(HfLlama, TiedHeadMayBeSavedOnlyEqualToTheEmbedding) {
  const ModelConfig m = llama_config(true);
  FullTensors hf = llama_to_hf(m, llama_ours(m));
  hf["lm_head.weight"] = hf.at("model.embed_tokens.weight");
  EXPECT_NO_THROW(llama_from_hf(m, hf, "x.safetensors"));
  hf["lm_head.weight"].data[7] += 1;
  const std::string msg = input_error([&] { llama_from_hf(m, hf, "x.safetensors"); });
  EXPECT_TRUE(contains(msg, "x.safetensors: lm_head.weight")) << msg;
  EXPECT_TRUE(contains(msg, "tie_embeddings")) << msg;
}

TEST(HfLlama, MissingOrMisshapenTensorIsNamed) {
  const ModelConfig m = llama_config(false);
  FullTensors hf = llama_to_hf(m, llama_ours(m));
  FullTensors missing = hf;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  std::string msg = input_error([&] { llama_from_hf(m, missing, "f.safetensors"); });
  EXPECT_TRUE(contains(msg, "f.safetensors: model.layers.1.mlp.up_proj.weight")) << msg;
  // k_proj as if there were as many key/value heads as query heads.
  hf["model.layers.0.self_attn.k_proj.weight"] = numbered({16, 16}, 99);
  msg = input_error([&] { llama_from_hf(m, hf, "f.safetensors"); });
  EXPECT_TRUE(contains(msg, "model.layers.0.self_attn.k_proj.weight")) << msg;
  EXPECT_TRUE(contains(msg, "(8, 16)")) << msg;
  EXPECT_TRUE(contains(msg, "(16, 16)")) << msg;
}

TEST(HfLlama, ConfigJsonIsLlamaConfigAndPassesItsOwnCheck) {
  ModelConfig m = llama_config(false);
  const json c = llama_hf_config(m);
  EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 4);
  EXPECT_EQ(c["intermediate_size"], 24);
  EXPECT_EQ(c["max_position_embeddings"], 8);
  EXPECT_EQ(c["rope_theta"], 500000.0);
  EXPECT_TRUE(c["rope_scaling"].is_null());
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_NO_THROW(llama_check_hf_config(m, c, "d/config.json"));
  m.rope_scaling = RopeScaling{};
  const json s = llama_hf_config(m);
  EXPECT_EQ(s["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(s["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_NO_THROW(llama_check_hf_config(m, s, "d/config.json"));
  // transformers 5's spelling: rope_parameters.
  json v5 = s;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = s["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  EXPECT_NO_THROW(llama_check_hf_config(m, v5, "d/config.json"));
}

TEST(HfLlama, ConfigJsonMismatchNamesTheKeyAndBothValues) {
  const ModelConfig m = llama_config(false);
  const json good = llama_hf_config(m);
  struct Case {
    const char* key;
    json value;
    std::vector<std::string> fragments;
  };
  const Case cases[] = {
      {"num_key_value_heads", 4, {"num_key_value_heads: 2", "found 4"}},
      {"num_hidden_layers", 3, {"num_hidden_layers: 2", "model.num_layers", "found 3"}},
      {"intermediate_size", 32, {"intermediate_size: 24", "found 32"}},
      {"rope_theta", 10000.0, {"rope_theta: 500000", "found 10000"}},
      {"tie_word_embeddings", true, {"tie_word_embeddings: false", "found true"}},
      {"hidden_act", "gelu", {"hidden_act", "\"silu\"", "\"gelu\""}},
      {"model_type", "mistral", {"model_type", "\"mistral\""}},
      {"rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}, {"rope_scaling.rope_type"}},
  };
  for (const Case& c : cases) {
    json bad = good;
    bad[c.key] = c.value;
    const std::string msg = input_error([&] { llama_check_hf_config(m, bad, "dir/config.json"); });
    EXPECT_EQ(msg.rfind("error: dir/config.json: ", 0), 0u) << msg;
    for (const std::string& f : c.fragments) EXPECT_TRUE(contains(msg, f)) << c.key << ": " << msg;
  }
  // Absent keys take LlamaConfig's defaults: num_key_value_heads = num_attention_heads.
  json absent = good;
  absent.erase("num_key_value_heads");
  const std::string msg = input_error([&] { llama_check_hf_config(m, absent, "dir/config.json"); });
  EXPECT_TRUE(contains(msg, "num_key_value_heads: 2")) << msg;
  EXPECT_TRUE(contains(msg, "found 4")) << msg;
}

// ---- model directories ----

FullTensors sample_hf(int layers) {
  FullTensors t;
  int id = 1;
  t["model.embed_tokens.weight"] = numbered({10, 4}, id++);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "a.weight"] = numbered({4, 4}, id++);
    t[p + "b.weight"] = numbered({4}, id++);
  }
  t["model.norm.weight"] = numbered({4}, id++);
  t["lm_head.weight"] = numbered({10, 4}, id++);
  return t;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

TEST(HfDirectory, OrderComparesLayerNumbersAsNumbersAndPutsTheHeadLast) {
  const std::vector<std::string> order = hf_tensor_order(sample_hf(11));
  const std::vector<std::string> head = {"model.embed_tokens.weight", "model.layers.0.a.weight",
                                         "model.layers.0.b.weight",   "model.layers.1.a.weight",
                                         "model.layers.1.b.weight",   "model.layers.2.a.weight"};
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 6), head);
  EXPECT_EQ(order[order.size() - 3], "model.layers.10.b.weight");
  EXPECT_EQ(order[order.size() - 2], "model.norm.weight");
  EXPECT_EQ(order.back(), "lm_head.weight");
}

TEST(HfDirectory, ShardPlanFollowsHuggingFaceHub) {
  // huggingface_hub's split_torch_state_dict_into_shards with max 100, worked by hand: a shard
  // closes when the next tensor would pass 100; a tensor over 100 gets a shard of its own,
  // appended at once while the open shard stays open.
  const std::vector<std::pair<std::string, int64_t>> sizes = {{"a", 40},  {"b", 60}, {"c", 1},
                                                              {"d", 150}, {"e", 99}, {"f", 100}};
  const std::vector<std::vector<std::string>> want = {{"a", "b"}, {"d"}, {"c", "e"}, {"f"}};
  EXPECT_EQ(hf_shard_plan(sizes, 100), want);
  EXPECT_EQ(hf_shard_plan({}, 100), std::vector<std::vector<std::string>>{{}});
}

TEST(HfDirectory, SizesAsTransformersSpellsThem) {
  EXPECT_EQ(parse_hf_size("5GB"), 5000000000);
  EXPECT_EQ(parse_hf_size("500MB"), 500000000);
  EXPECT_EQ(parse_hf_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_hf_size("1.5kb"), 1500);
  EXPECT_EQ(parse_hf_size("12345"), 12345);
  EXPECT_EQ(parse_hf_size(" 10 KiB "), 10240);
  for (const char* bad : {"", "GB", "5XB", "-3MB", "0", "1e3", "5 G B"})
    EXPECT_FALSE(parse_hf_size(bad).has_value()) << bad;
}

void expect_same(const FullTensors& a, const FullTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(b.at(name).shape, t.shape) << name;
    EXPECT_EQ(0, std::memcmp(b.at(name).data.data(), t.data.data(), t.data.size() * 4)) << name;
  }
}

TEST(HfDirectory, OneFileWhenItFits) {
  const std::string dir = scratch("single");
  const FullTensors t = sample_hf(3);
  write_hf_directory(dir, json{{"model_type", "x"}}, t, HfWriteOptions{});
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(read_json_file(dir + "/config.json"), (json{{"model_type", "x"}}));
  const StFile f = read_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  const HfTensors back = read_hf_tensors(dir);
  expect_same(t, back.tensors);
  EXPECT_EQ(back.listing, dir + "/model.safetensors");
  fs::remove_all(dir);
}

TEST(HfDirectory, ShardedAsSavePretrainedAndReadBackBitForBit) {
  const std::string dir = scratch("sharded");
  FullTensors t = sample_hf(4);
  t["model.layers.0.a.weight"].data[3] = -0.0f;                   // bits, not values, must survive
  t["model.layers.0.a.weight"].data[4] = std::ldexp(1.0f, -140);  // a subnormal
  // (A NaN is written as it is, and refused when read back: HfDtypes.Bf16AndF16ReadExactly.)
  // 16-float tensors are 64 bytes, 4-float 16, the embedding and head 160: max 100 bytes.
  HfWriteOptions o;
  o.max_shard_bytes = 100;
  // A stale single file from an earlier save must go.
  fs::create_directories(dir);
  std::ofstream(dir + "/model.safetensors") << "old";
  write_hf_directory(dir, json{{"model_type", "x"}}, t, o);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  const json index = read_json_file(dir + "/model.safetensors.index.json");
  int64_t total = 0;
  for (const auto& [n, x] : t) total += static_cast<int64_t>(x.data.size()) * 4;
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["metadata"]["total_parameters"], total / 4);
  ASSERT_EQ(index["weight_map"].size(), t.size());
  // Order: embed (160 > 100: alone, shard 1), layers 0..3 (a 64 + b 16 = 80 each: one shard per
  // layer, 2..4 for layers 0..2), norm (16: joins layer 3's open shard, 96 ≤ 100), head (160 >
  // 100: a shard of its own appended at once, 5, before the open shard closes as 6).
  const json& wm = index["weight_map"];
  EXPECT_EQ(wm["model.embed_tokens.weight"], "model-00001-of-00006.safetensors");
  EXPECT_EQ(wm["model.layers.0.a.weight"], "model-00002-of-00006.safetensors");
  EXPECT_EQ(wm["model.layers.0.b.weight"], "model-00002-of-00006.safetensors");
  EXPECT_EQ(wm["model.layers.2.b.weight"], "model-00004-of-00006.safetensors");
  EXPECT_EQ(wm["lm_head.weight"], "model-00005-of-00006.safetensors");
  EXPECT_EQ(wm["model.layers.3.a.weight"], "model-00006-of-00006.safetensors");
  EXPECT_EQ(wm["model.norm.weight"], "model-00006-of-00006.safetensors");
  for (int k = 1; k <= 6; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "/model-%05d-of-00006.safetensors", k);
    EXPECT_TRUE(fs::exists(dir + name)) << name;
  }
  const HfTensors back = read_hf_tensors(dir);
  expect_same(t, back.tensors);
  EXPECT_EQ(back.file.at("model.norm.weight"), dir + "/model-00006-of-00006.safetensors");

  // Saving again unsharded removes the shards and the index.
  write_hf_directory(dir, json{{"model_type", "x"}}, t, HfWriteOptions{});
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00006.safetensors"));
  expect_same(t, read_hf_tensors(dir).tensors);
  fs::remove_all(dir);
}

TEST(HfDirectory, ShardsFollowTheAdaptersOrder) {
  // The adapter's state-dict order decides the shards; names it lacks follow in name order,
  // names without a tensor are skipped. Each 64-byte tensor fills a 100-byte shard.
  const std::string dir = scratch("order");
  FullTensors t;
  for (const char* n : {"a", "b", "z"}) t[n] = numbered({16}, 1);
  HfWriteOptions o;
  o.max_shard_bytes = 100;
  write_hf_directory(dir, json::object(), t, o, {"z", "absent", "a"});
  const json wm = read_json_file(dir + "/model.safetensors.index.json")["weight_map"];
  EXPECT_EQ(wm, (json{{"z", "model-00001-of-00003.safetensors"},
                      {"a", "model-00002-of-00003.safetensors"},
                      {"b", "model-00003-of-00003.safetensors"}}));
  fs::remove_all(dir);
}

TEST(HfDirectory, MissingShardOrTensorIsNamed) {
  const std::string dir = scratch("bad");
  const FullTensors t = sample_hf(2);
  HfWriteOptions o;
  o.max_shard_bytes = 100;
  write_hf_directory(dir, json::object(), t, o);
  const std::string index_path = dir + "/model.safetensors.index.json";
  json index = read_json_file(index_path);
  const std::string shard = index["weight_map"]["model.layers.1.a.weight"];

  // The index lists a tensor its shard does not hold.
  json extra = index;
  extra["weight_map"]["model.layers.1.c.weight"] = shard;
  std::ofstream(index_path) << extra.dump(2);
  std::string msg = input_error([&] { read_hf_tensors(dir); });
  EXPECT_TRUE(contains(msg, dir + "/" + shard + ": tensor model.layers.1.c.weight")) << msg;

  // A shard is missing.
  std::ofstream(index_path) << index.dump(2);
  fs::remove(dir + "/" + shard);
  msg = input_error([&] { read_hf_tensors(dir); });
  EXPECT_TRUE(contains(msg, dir + "/" + shard + ": tensor model.layers.1.")) << msg;
  EXPECT_TRUE(contains(msg, "missing")) << msg;

  // No weights at all; no config.json.
  fs::remove_all(dir);
  fs::create_directories(dir);
  msg = input_error([&] { read_hf_tensors(dir); });
  EXPECT_TRUE(contains(msg, dir + "/model.safetensors")) << msg;
  msg = input_error([&] { read_hf_config(dir); });
  EXPECT_TRUE(contains(msg, dir + "/config.json")) << msg;
  fs::remove_all(dir);
}

// An index may name only files of its own directory: an absolute path, a path with directories
// or "..", and a link leading out are refused with the index and the entry, and no byte of the
// foreign file is read or printed (before, an index naming /etc/passwd was opened and the error
// printed its first 8 bytes as a header length).
TEST(HfDirectory, IndexNamesOnlyFilesOfItsDirectory) {
  const std::string dir = scratch("escape");
  const FullTensors t = sample_hf(2);
  HfWriteOptions o;
  o.max_shard_bytes = 100;
  write_hf_directory(dir, json::object(), t, o);
  const std::string index_path = dir + "/model.safetensors.index.json";
  const json index = read_json_file(index_path);
  const std::string outside = scratch("outside.safetensors");
  std::ofstream(outside) << "OUTSIDE!" << std::string(64, 'x');
  fs::create_symlink(outside, dir + "/link.safetensors");
  fs::create_directories(dir + "/sub");
  for (const std::string& bad :
       {outside, std::string("/etc/passwd"),
        std::string("../") + fs::path(outside).filename().string(),
        std::string("sub/model.safetensors"), std::string("link.safetensors"), std::string(".."),
        std::string("")}) {
    json j = index;
    j["weight_map"]["model.layers.1.a.weight"] = bad;
    std::ofstream(index_path) << j.dump(2);
    const std::string msg = input_error([&] { read_hf_tensors(dir); });
    EXPECT_TRUE(contains(msg, index_path + ": weight_map.model.layers.1.a.weight")) << msg;
    EXPECT_TRUE(contains(msg, "a plain file name")) << msg;
    EXPECT_FALSE(contains(msg, "OUTSIDE") || contains(msg, "root:")) << msg;
  }
  // A link to a file of the directory itself is a file of the directory.
  json j = index;
  const std::string shard = index["weight_map"]["model.layers.1.a.weight"];
  fs::create_symlink(dir + "/" + shard, dir + "/alias.safetensors");
  for (auto& [name, file] : j["weight_map"].items())
    if (file == shard) file = "alias.safetensors";
  std::ofstream(index_path) << j.dump(2);
  EXPECT_EQ(read_hf_tensors(dir).tensors.size(), t.size());
  fs::remove_all(dir);
  fs::remove(outside);
}

TEST(HfDirectory, LlamaTensorsThroughAShardedDirectory) {
  // The adapter and the directory together, as model.init_from uses them.
  const std::string dir = scratch("llama");
  const ModelConfig m = llama_config(false);
  const FullTensors ours = llama_ours(m);
  HfWriteOptions o;
  o.max_shard_bytes = 4000;
  write_hf_directory(dir, llama_hf_config(m), llama_to_hf(m, ours), o);
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  llama_check_hf_config(m, read_hf_config(dir), dir + "/config.json");
  const FullTensors back = llama_from_hf(m, read_hf_tensors(dir).tensors, dir);
  for (const auto& [name, t] : back)
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), ours.at(name).data.begin())) << name;
  fs::remove_all(dir);
}

// ---- 16-bit floats ----

// A one-tensor safetensors file written byte by byte (not by Strata's writer).
void write_raw(const std::string& path, const std::string& dtype, const std::vector<uint16_t>& v) {
  std::string header = "{\"t\":{\"dtype\":\"" + dtype + "\",\"shape\":[" +
                       std::to_string(v.size()) + "],\"data_offsets\":[0," +
                       std::to_string(2 * v.size()) + "]}}";
  const uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(2 * v.size()));
}

TEST(HfDtypes, Bf16AndF16ReadExactly) {
  const std::string path = scratch("half.safetensors");
  // bf16: 1, -3, 2⁻¹³³ (the smallest subnormal), 0x3f81 = 1 + 2⁻⁷, -0, +inf, max finite.
  write_raw(path, "BF16", {0x3f80, 0xc040, 0x0001, 0x3f81, 0x8000, 0x7f80, 0x7f7f});
  std::vector<float> got = StReader(path).read_f32("t");
  const std::vector<float> bf = {
      1.0f,  -3.0f,    std::ldexp(1.0f, -133), 1.0f + std::ldexp(1.0f, -7),
      -0.0f, INFINITY, std::ldexp(255.0f, 120)};
  ASSERT_EQ(got.size(), bf.size());
  for (size_t i = 0; i < bf.size(); ++i) EXPECT_EQ(0, std::memcmp(&got[i], &bf[i], 4)) << i;
  // f16: 1, 2⁻²⁴ (smallest subnormal), 1023·2⁻²⁴ (largest subnormal), -2⁻¹⁴ (smallest normal),
  // 65504 (max), 1 + 2⁻¹⁰, -inf.
  write_raw(path, "F16", {0x3c00, 0x0001, 0x03ff, 0x8400, 0x7bff, 0x3c01, 0xfc00});
  got = StReader(path).read_f32("t");
  const std::vector<float> h = {1.0f,
                                std::ldexp(1.0f, -24),
                                std::ldexp(1023.0f, -24),
                                -std::ldexp(1.0f, -14),
                                65504.0f,
                                1.0f + std::ldexp(1.0f, -10),
                                -INFINITY};
  ASSERT_EQ(got.size(), h.size());
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(got[i], h[i]) << i;
  // read_hf_tensors (model.init_from's, generate's and eval's reader) refuses weights that are not
  // finite, naming the tensor and the first bad element (before, a NaN or an infinity was used
  // silently: generate gave all-zero ids, eval null log-likelihoods, both with exit 0).
  std::string msg = input_error([&] { read_hf_tensors(path); });
  EXPECT_TRUE(contains(msg, path + ": tensor t: finite values; element 6 is -inf")) << msg;
  write_raw(path, "F16", {0x3c00, 0x7e00});
  EXPECT_TRUE(std::isnan(StReader(path).read_f32("t")[1]));
  msg = input_error([&] { read_hf_tensors(path); });
  EXPECT_TRUE(contains(msg, "element 1 is NaN")) << msg;
  write_raw(path, "F16", {0x3c00, 0x3c01});
  EXPECT_EQ(read_hf_tensors(path).tensors.at("t").data,
            (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -10)}));
  fs::remove(path);
}

TEST(HfDtypes, Bf16WritingRoundsToNearestEven) {
  const std::string dir = scratch("bf16");
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16's spacing at 1
  FullTensors t;
  t["x"] = {{6},
            {one + ulp,                              // representable: kept
             one + ulp / 2,                          // a tie: to even (1)
             one + 3 * ulp / 2,                      // a tie: to even (1 + 2 ulp)
             one + ulp / 2 + std::ldexp(1.0f, -20),  // past the tie: up
             -2.5f, 3e38f}};
  HfWriteOptions o;
  o.dtype = "BF16";
  write_hf_directory(dir, json::object(), t, o);
  StReader r(dir + "/model.safetensors");
  EXPECT_EQ(r.entries().at("x").dtype, "BF16");
  const std::vector<float> got = r.read_f32("x");
  EXPECT_EQ(got[0], one + ulp);
  EXPECT_EQ(got[1], one);
  EXPECT_EQ(got[2], one + 2 * ulp);
  EXPECT_EQ(got[3], one + ulp);
  EXPECT_EQ(got[4], -2.5f);
  EXPECT_EQ(got[5], std::ldexp(226.0f, 120));  // 3e38 = 0x7f61b1e6 → 0x7f62
  fs::remove_all(dir);
}

// ---- GPT through the registry: export to a directory, init_from it ----

Config tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> s = {"model.preset=tiny",        "train.threads=1",
                                "train.eval_interval=0",    "log.interval=100000",
                                "train.micro_batch_size=2", "train.global_batch_size=4",
                                "train.iterations=2"};
  s.insert(s.end(), extra.begin(), extra.end());
  return load_config("", s);
}

TrainResult train(const std::vector<std::string>& extra) {
  RunContext c;
  c.verbose = false;
  return run_training(tiny(extra), c);
}

TEST(HfGpt, ExportDirectoryThenInitFromGivesBackTheParameters) {
  const std::string ckpt = scratch("gpt_ckpt"), out = scratch("gpt_hf");
  const TrainResult full = train({"checkpoint.dir=" + ckpt, "checkpoint.interval=2"});
  HfWriteOptions o;
  o.max_shard_bytes = 40000;  // the 64·64 embedding is 16 KiB: several shards
  export_checkpoint(ckpt, out, o);
  ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  const json config = read_json_file(out + "/config.json");
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_inner"], 256);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  const TrainResult r = train({"model.init_from=" + out, "train.iterations=0"});
  EXPECT_EQ(r.final_params, full.final_params);

  // config.json disagreeing with the model config: named before any tensor is read.
  json bad = config;
  bad["n_layer"] = 3;
  std::ofstream(out + "/config.json") << bad.dump(2);
  std::string msg = input_error([&] { train({"model.init_from=" + out, "train.iterations=0"}); });
  EXPECT_TRUE(contains(msg, out + "/config.json: n_layer: 2 (model.num_layers")) << msg;
  EXPECT_TRUE(contains(msg, "found 3")) << msg;
  std::ofstream(out + "/config.json") << config.dump(2);

  // A tensor of the wrong shape in a shard: the shard and the tensor are named.
  const json index = read_json_file(out + "/model.safetensors.index.json");
  const std::string shard =
      out + "/" + index["weight_map"]["transformer.h.1.mlp.c_fc.bias"].get<std::string>();
  StFile f = read_safetensors(shard);
  std::vector<float> wrong(100, 0.0f);
  f.tensors["transformer.h.1.mlp.c_fc.bias"] = st_from_f32(wrong.data(), {100});
  write_safetensors(shard, f);
  msg = input_error([&] { train({"model.init_from=" + out, "train.iterations=0"}); });
  EXPECT_TRUE(contains(msg, shard + ": transformer.h.1.mlp.c_fc.bias: shape (256)")) << msg;
  fs::remove_all(ckpt);
  fs::remove_all(out);
}

TEST(HfGpt, Bf16ExportReadsBackRounded) {
  const std::string ckpt = scratch("gpt_bf16_ckpt"), out = scratch("gpt_bf16.safetensors");
  train({"checkpoint.dir=" + ckpt, "checkpoint.interval=2"});
  export_checkpoint(ckpt, out, HfWriteOptions{5'000'000'000, "BF16"});
  const std::string f32 = scratch("gpt_f32.safetensors");
  export_checkpoint(ckpt, f32);
  StReader a(out), b(f32);
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const auto& [name, e] : b.entries()) {
    ASSERT_EQ(a.entries().at(name).dtype, "BF16") << name;
    const std::vector<float> lo = a.read_f32(name), hi = b.read_f32(name);
    for (size_t i = 0; i < hi.size(); ++i)  // within half of bf16's relative spacing
      ASSERT_LE(std::fabs(lo[i] - hi[i]), std::fabs(hi[i]) * std::ldexp(1.0, -8)) << name << i;
  }
  fs::remove_all(ckpt);
  fs::remove(out);
  fs::remove(f32);
}

// The registered llama architecture: a checkpoint exported to a sharded directory (with a llama3
// RoPE scaling and theta that config.json must carry) and read back by model.init_from.
TEST(HfLlama, ExportDirectoryThenInitFromGivesBackTheParameters) {
  const std::string ckpt = scratch("llama_ckpt"), out = scratch("llama_hf");
  const std::vector<std::string> llama = {
      "model.preset=llama-tiny", "model.rope_theta=500000",
      R"(model.rope_scaling={"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, )"
      R"("high_freq_factor": 4, "original_max_position_embeddings": 32})"};
  std::vector<std::string> first = llama;
  first.insert(first.end(), {"checkpoint.dir=" + ckpt, "checkpoint.interval=2"});
  const TrainResult full = train(first);
  HfWriteOptions o;
  o.max_shard_bytes = 50000;
  export_checkpoint(ckpt, out, o);
  const json config = read_json_file(out + "/config.json");
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["rope_theta"], 500000.0);
  EXPECT_EQ(config["rope_scaling"]["original_max_position_embeddings"], 32);
  const json wm = read_json_file(out + "/model.safetensors.index.json")["weight_map"];
  EXPECT_EQ(wm.size(), 1u + 2u * 9u + 2u);
  std::vector<std::string> again = llama;
  again.insert(again.end(), {"model.init_from=" + out, "train.iterations=0"});
  EXPECT_EQ(train(again).final_params, full.final_params);

  // The same directory for a config with another theta: config.json names it.
  std::vector<std::string> other = again;
  other[1] = "model.rope_theta=10000";
  const std::string msg = input_error([&] { train(other); });
  EXPECT_TRUE(contains(msg, out + "/config.json: rope_theta: 10000")) << msg;
  EXPECT_TRUE(contains(msg, "found 500000")) << msg;
  fs::remove_all(ckpt);
  fs::remove_all(out);
}

// Import is strict and complete (issue 27): every tensor of the file is used or the import is
// refused naming the first unused one; a tied config refuses a file with its own head; both of
// GPT-2's name spellings load; the causal-mask buffers of older files are skipped; more
// positions than model.seq_len give the first seq_len; a BF16 file loads as its values.
TEST(HfGpt, ImportUsesEveryTensorOrRefuses) {
  const std::string ckpt = scratch("strict_ckpt"), file = scratch("strict.safetensors");
  const TrainResult full = train({"checkpoint.dir=" + ckpt, "checkpoint.interval=2"});
  export_checkpoint(ckpt, file);  // one safetensors file, no config.json
  const StFile exported = read_safetensors(file);
  auto init_from = [&](const StFile& f, std::vector<std::string> extra = {}) {
    write_safetensors(file, f);
    extra.push_back("model.init_from=" + file);
    extra.push_back("train.iterations=0");
    return train(extra);
  };
  EXPECT_EQ(init_from(exported).final_params, full.final_params);

  // A 2-layer file into a 1-layer config: layer 1 would be dropped silently.
  std::string msg = input_error([&] { init_from(exported, {"model.num_layers=1"}); });
  EXPECT_TRUE(contains(msg, file + ": tensor transformer.h.1.")) << msg;
  EXPECT_TRUE(contains(msg, "no place in it")) << msg;

  // A tied config (tiny is tied) with a file whose head differs from the embedding.
  StFile own_head = exported;
  std::vector<float> head = own_head.tensors.at("lm_head.weight").as_f32();
  head[7] += 0.5f;
  own_head.tensors["lm_head.weight"] = st_from_f32(head.data(), {64, 64});
  msg = input_error([&] { init_from(own_head); });
  EXPECT_TRUE(contains(msg, "lm_head.weight")) << msg;
  EXPECT_TRUE(contains(msg, "model.tie_embeddings false")) << msg;

  // GPT-2's published spelling (no "transformer."), with its attention-mask buffers.
  StFile bare;
  bare.metadata = exported.metadata;
  for (const auto& [name, t] : exported.tensors)
    bare.tensors[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = t;
  std::vector<float> mask(16 * 16, 1.0f);
  bare.tensors["h.0.attn.bias"] = st_from_f32(mask.data(), {1, 1, 16, 16});
  bare.tensors["h.1.attn.masked_bias"] = st_from_f32(mask.data(), {1});
  EXPECT_EQ(init_from(bare).final_params, full.final_params);
  // A tensor in both spellings is one too many.
  StFile twice = bare;
  twice.tensors["transformer.ln_f.bias"] = exported.tensors.at("transformer.ln_f.bias");
  msg = input_error([&] { init_from(twice); });
  EXPECT_TRUE(contains(msg, "in the file twice")) << msg;

  // 96 positions into a config of 64 (tiny's seq_len): the first 64 rows.
  StFile longer = exported;
  std::vector<float> wpe = exported.tensors.at("transformer.wpe.weight").as_f32();
  std::vector<float> more = wpe;
  more.resize(wpe.size() * 3 / 2, 0.25f);
  longer.tensors["transformer.wpe.weight"] = st_from_f32(more.data(), {96, 64});
  EXPECT_EQ(init_from(longer).final_params, full.final_params);
  // Fewer positions than seq_len: refused, naming the tensor and both shapes.
  more.resize(wpe.size() / 2);
  longer.tensors["transformer.wpe.weight"] = st_from_f32(more.data(), {32, 64});
  msg = input_error([&] { init_from(longer); });
  EXPECT_TRUE(contains(msg, "transformer.wpe.weight: shape (64, 64)")) << msg;

  // BF16: the values the file holds, through the same path.
  export_checkpoint(ckpt, file, HfWriteOptions{5'000'000'000, "BF16"});
  const StFile bf16 = read_safetensors(file);
  const TrainResult low = init_from(bf16);
  StReader r(file);
  EXPECT_EQ(low.final_params.size(), full.final_params.size());
  const std::vector<float> ln = r.read_f32("transformer.ln_f.weight");
  EXPECT_NE(std::find(low.final_params.begin(), low.final_params.end(), ln[3]),
            low.final_params.end());
  fs::remove_all(ckpt);
  fs::remove(file);
}

// Llama's adapter follows the same rules: an extra layer is refused, rotary buffers are skipped.
TEST(HfLlama, ImportUsesEveryTensorOrRefuses) {
  const ModelConfig m = llama_config(false);
  const std::string file = scratch("llama_strict.safetensors");
  const FullTensors hf = llama_to_hf(m, llama_ours(m));
  write_hf_file(file, hf, "F32");
  EXPECT_NO_THROW(load_hf_model(m, file));
  FullTensors extra = hf;
  extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = numbered({4}, 1);
  write_hf_file(file, extra, "F32");
  EXPECT_NO_THROW(load_hf_model(m, file));
  extra["model.layers.2.mlp.up_proj.weight"] = hf.at("model.layers.1.mlp.up_proj.weight");
  write_hf_file(file, extra, "F32");
  const std::string msg = input_error([&] { load_hf_model(m, file); });
  EXPECT_TRUE(contains(msg, file + ": tensor model.layers.2.mlp.up_proj.weight")) << msg;
  fs::remove(file);
}

}  // namespace
}  // namespace strata
