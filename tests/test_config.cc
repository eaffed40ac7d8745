// test_config.cc — config loading: defaults, preset/file/--set layering, strict validation, the
// world-size checks, the parallel layout's one table (the config's keys and --fix), and the
// shipped presets and training configs.
//
// Expected values come from the design's example config (the defaults, copied below as text;
// docs/config.md lists the same) and from the published model sizes (GPT-2, GPT-3 papers), never
// from the parser's own tables.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/config/layout_fields.h"
#include "launch/config/world_layout.h"
#include "runtime/base/error.h"
#include "runtime/engine/optimizer.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The design's example config (the defaults of docs/config.md), verbatim.
const char kDesignDefaults[] = R"({
  "model":     {"preset": "gpt2-124m", "arch": "gpt", "num_layers": 12, "hidden_size": 768, "num_heads": 12,
                "ffn_hidden_size": 3072, "seq_len": 1024, "vocab_size": 50257, "tie_embeddings": true,
                "dropout": 0.0, "init_std": 0.02, "init_from": null},
  "parallel":  {"tensor": 1, "pipeline": 1, "data": null, "virtual_stages": 1, "schedule": "1f1b",
                "layers_per_stage": null, "sequence_parallel": false, "distributed_optimizer": false,
                "bucket_mb": 25},
  "train":     {"micro_batch_size": 4, "global_batch_size": 32, "iterations": 100, "seed": 1234,
                "recompute": "none", "precision": "fp32", "threads": null, "eval_interval": 50,
                "eval_iters": 10, "skip_nonfinite": true},
  "optimizer": {"name": "adamw", "lr": 3e-4, "min_lr": 3e-5, "warmup_iters": 10, "decay": "cosine",
                "decay_iters": null, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                "grad_clip": 1.0},
  "data":      {"source": "synthetic", "path": null, "val_fraction": 0.1,
                "synthetic": {"vocab_size": 64, "order": 2, "seed": 7}},
  "checkpoint":{"dir": null, "interval": 0, "keep": 3, "resume": "auto"},
  "log":       {"interval": 1, "metrics": null, "trace": null},
  "comm":      {"timeout_s": 300},
  "device":    "auto"
})";

const char kFile[] = "cfg.json";
const char kCmd[] = "<command line>";

// Runs `f`, which must throw InputError, and returns the error.
InputError expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an InputError";
  return InputError("", "", "");
}

InputError config_error(const json& j, const std::vector<std::string>& sets = {}) {
  return expect_error([&] { config_from_json(j, kFile, sets); });
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A scratch directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::path(::testing::TempDir()) / (std::string("strata_config_") + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// ---- defaults and layering ----

// Keys added after the design's example, with their defaults (docs/config.md): a config written
// against the design alone resolves to them.
// The Llama family's keys are the design's (its model.arch notes), with LlamaConfig's defaults;
// so are the mixtures of experts' (0 experts: a dense MLP).
// parallel.context and parallel.expert are the design's (its parallel notes), default 1.
// optimizer.wsd_decay_iters and wsd_decay_style are Megatron-LM's WSD schedule
// (lr_wsd_decay_iters, lr_wsd_decay_style and its default).
// decoder_sparse_step and mlp_only_layers are Qwen3-MoE's dense layers (Qwen3MoeConfig's names and
// defaults: every layer of a mixture sparse).
const char kAddedDefaults[] = R"({"parallel": {"context": 1, "expert": 1},
  "train": {"attention_backend": "auto"},
  "data": {"blend": null, "tokenizer": null,
           "masked_lm": {"mask_prob": 0.15, "short_seq_prob": 0.1, "sentence_order": false,
                         "cls_id": null, "sep_id": null, "mask_id": null, "pad_id": null}},
  "log": {"sample_interval": 0, "sample_prompt": null, "sample_tokens": 32},
  "checkpoint": {"async": false},
  "optimizer": {"wsd_decay_iters": null, "wsd_decay_style": "exponential"},
  "model": {"num_key_value_heads": null, "rope_theta": 10000, "rope_scaling": null,
            "rms_norm_eps": 1e-5, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
            "num_experts": 0, "num_experts_per_tok": 2, "moe_intermediate_size": null,
            "norm_topk_prob": true, "router_aux_loss_coef": 0.001,
            "moe_capacity_factor": null, "head_dim": null, "decoder_sparse_step": 1,
            "mlp_only_layers": []}})";

json design_defaults_with_additions() {
  json j = json::parse(kDesignDefaults);
  j.update(json::parse(kAddedDefaults), /*merge_objects=*/true);  // keeps nulls, unlike merge_patch
  return j;
}

TEST(ConfigDefaults, EqualDesign) {
  const Config c = load_config("", {});
  EXPECT_EQ(c.source_file, "<defaults>");
  EXPECT_EQ(c.resolved, design_defaults_with_additions()) << c.resolved.dump(2);
  EXPECT_EQ(c.model.preset, "gpt2-124m");
  EXPECT_EQ(c.model.num_layers, 12);
  EXPECT_EQ(c.model.ffn_hidden_size, 3072);
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.layout.data, 0);  // null: the rest of the world
  EXPECT_EQ(c.layout.schedule, ScheduleKind::kOneFOneB);
  EXPECT_EQ(c.layout.micro_batch_size, 4);
  EXPECT_EQ(c.train.global_batch_size, 32);
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.data.synthetic.order, 2);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_DOUBLE_EQ(c.comm.timeout_s, 300);
  EXPECT_EQ(c.device, "auto");
}

TEST(ConfigDefaults, DesignExampleIsAValidConfigFile) {
  const json design = json::parse(kDesignDefaults);
  const Config c = config_from_json(design, kFile);
  EXPECT_EQ(c.resolved, design_defaults_with_additions());
  EXPECT_EQ(c.source_file, kFile);
}

TEST(ConfigDefaults, EmptyObjectAndMissingSections) {
  EXPECT_EQ(config_from_json(json::object(), kFile).resolved, design_defaults_with_additions());
  const Config c = config_from_json(json::parse(R"({"train": {"iterations": 7}})"), kFile);
  EXPECT_EQ(c.train.iterations, 7);
  EXPECT_EQ(c.layout.micro_batch_size, 4);
  EXPECT_EQ(c.resolved["train"]["iterations"], 7);
  EXPECT_EQ(c.resolved["optimizer"]["lr"], 3e-4);
}

TEST(ConfigDefaults, BuiltInModelIsTheGpt2_124mPresetFile) {
  const json preset = load_model_preset("gpt2-124m", kFile, "model.preset");
  const json defaults = load_config("", {}).resolved["model"];
  for (const auto& [key, value] : preset.items()) EXPECT_EQ(defaults[key], value) << key;
}

TEST(ConfigLayering, PresetThenFileKeys) {
  const Config c =
      config_from_json(json::parse(R"({"model": {"preset": "tiny", "num_layers": 3}})"), kFile);
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.num_layers, 3);  // the file overrides the preset
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_heads, 4);
  EXPECT_EQ(c.model.ffn_hidden_size, 256);
  EXPECT_EQ(c.model.seq_len, 64);
  EXPECT_EQ(c.model.vocab_size, 64);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.02);  // not a preset key: the default stays
  EXPECT_EQ(c.resolved["model"]["preset"], "tiny");
}

TEST(ConfigLayering, FfnFollowsHiddenSizeUnlessGiven) {
  // No preset named: the file's hidden_size alone.
  EXPECT_EQ(
      config_from_json(json::parse(R"({"model": {"hidden_size": 1024, "num_heads": 16}})"), kFile)
          .model.ffn_hidden_size,
      4096);
  // The file widens the preset's hidden_size: the preset's ffn no longer applies.
  EXPECT_EQ(
      config_from_json(json::parse(R"({"model": {"preset": "tiny", "hidden_size": 128}})"), kFile)
          .model.ffn_hidden_size,
      512);
  // Given beside hidden_size: kept.
  EXPECT_EQ(config_from_json(json::parse(R"({"model": {"preset": "tiny", "hidden_size": 128,
                                                       "ffn_hidden_size": 300}})"),
                             kFile)
                .model.ffn_hidden_size,
            300);
  // Given in the file, hidden_size from --set: derived from the later hidden_size.
  EXPECT_EQ(config_from_json(json::parse(R"({"model": {"preset": "tiny"}})"), kFile,
                             {"model.hidden_size=32"})
                .model.ffn_hidden_size,
            128);
  // hidden_size only from the preset: the preset's ffn stays.
  EXPECT_EQ(config_from_json(json::parse(R"({"model": {"preset": "tiny", "num_heads": 8}})"), kFile)
                .model.ffn_hidden_size,
            256);
}

TEST(ConfigLayering, PresetNull) {
  const Config c = config_from_json(json::parse(R"({"model": {"preset": null}})"), kFile);
  EXPECT_EQ(c.model.preset, "");
  EXPECT_TRUE(c.resolved["model"]["preset"].is_null());
  EXPECT_EQ(c.model.num_layers, 12);
}

// ---- --set ----

TEST(ConfigSet, JsonValue) {
  const Config c = load_config("", {"train.micro_batch_size=8", "parallel.layers_per_stage=[12]",
                                    "parallel.sequence_parallel=true", "optimizer.lr=1e-3"});
  EXPECT_EQ(c.layout.micro_batch_size, 8);
  EXPECT_EQ(c.layout.layers_per_piece, std::vector<int>{12});
  EXPECT_TRUE(c.layout.sequence_parallel);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
}

TEST(ConfigSet, StringValue) {
  const Config c =
      load_config("", {"data.source=text", "data.path=some file.txt", "checkpoint.resume=none",
                       "model.vocab_size=256", "log.metrics=\"quoted.jsonl\""});
  EXPECT_EQ(c.data.source, "text");
  EXPECT_EQ(c.data.path.value_or(""), "some file.txt");
  EXPECT_EQ(c.checkpoint.resume, "none");
  EXPECT_EQ(c.log.metrics.value_or(""), "quoted.jsonl");
}

TEST(ConfigSet, NestedPathTopLevelKeyAndSection) {
  const Config c = load_config(
      "", {"data.synthetic.order=3", "device=cpu", R"(parallel={"tensor": 2, "pipeline": 2})"});
  EXPECT_EQ(c.data.synthetic.order, 3);
  EXPECT_EQ(c.data.synthetic.vocab_size, 64);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.layout.tensor, 2);
  EXPECT_EQ(c.layout.pipeline, 2);
  EXPECT_EQ(c.layout.schedule, ScheduleKind::kOneFOneB);  // a section value merges key by key
}

TEST(ConfigSet, OverridesFileAndLaterSetWins) {
  const Config c = config_from_json(json::parse(R"({"train": {"iterations": 5}})"), kFile,
                                    {"train.iterations=6", "train.iterations=7"});
  EXPECT_EQ(c.train.iterations, 7);
}

TEST(ConfigSet, PresetGoesUnderTheFileKeys) {
  const Config c = config_from_json(json::parse(R"({"model": {"num_layers": 5}})"), kFile,
                                    {"model.preset=tiny"});
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_layers, 5);
}

TEST(ConfigSet, UnknownPath) {
  InputError e = expect_error([] { load_config("", {"train.nope=1"}); });
  EXPECT_EQ(e.file(), kCmd);
  EXPECT_EQ(e.where(), "train.nope");
  EXPECT_TRUE(contains(e.expected(), "unknown key")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "micro_batch_size")) << e.what();

  e = expect_error([] { load_config("", {"trian.iterations=1"}); });
  EXPECT_EQ(e.file(), kCmd);
  EXPECT_EQ(e.where(), "trian");

  e = expect_error([] { load_config("", {"train.seed.low=1"}); });
  EXPECT_EQ(e.where(), "train.seed.low");

  e = expect_error([] { load_config("", {R"(parallel={"tensr": 2})"}); });
  EXPECT_EQ(e.file(), kCmd);
  EXPECT_EQ(e.where(), "parallel.tensr");
}

TEST(ConfigSet, Malformed) {
  for (const char* arg : {"train.iterations", "=3", "train..iterations=3"}) {
    const InputError e = expect_error([&] { load_config("", {arg}); });
    EXPECT_EQ(e.file(), kCmd);
    EXPECT_TRUE(contains(e.expected(), "section.key=value")) << e.what();
  }
}

TEST(ConfigSet, BadValueNamesTheCommandLine) {
  const InputError e = config_error(json::object(), {"train.micro_batch_size=-3"});
  EXPECT_EQ(e.file(), kCmd);
  EXPECT_EQ(e.where(), "train.micro_batch_size");
  EXPECT_EQ(std::string(e.what()),
            "error: <command line>: train.micro_batch_size: expected a positive integer, got -3");
}

// ---- strictness: keys and types ----

TEST(ConfigErrors, UnknownTopLevelKey) {
  const InputError e = config_error(json::parse(R"({"modle": {}})"));
  EXPECT_EQ(e.file(), kFile);
  EXPECT_EQ(e.where(), "modle");
  EXPECT_TRUE(contains(e.expected(), "unknown key")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "model, parallel, train")) << e.what();
}

TEST(ConfigErrors, UnknownNestedKey) {
  InputError e = config_error(json::parse(R"({"model": {"hidden_sz": 8}})"));
  EXPECT_EQ(e.where(), "model.hidden_sz");
  EXPECT_TRUE(contains(e.expected(),
                       "unknown key (did you mean hidden_size? known keys of model: preset, arch,"))
      << e.what();
  // A key of another section is named with its section; nothing near, no suggestion.
  e = config_error(json::object(), {"train.lr=1e-3"});
  EXPECT_EQ(e.where(), "train.lr");
  EXPECT_TRUE(contains(e.expected(), "unknown key (did you mean optimizer.lr? known keys of train"))
      << e.what();
  e = config_error(json::parse(R"({"train": {"zzzzzz": 1}})"));
  EXPECT_TRUE(contains(e.expected(), "unknown key (known keys of train:")) << e.what();
  e = config_error(json::parse(R"({"data": {"synthetic": {"vocab": 8}}})"));
  EXPECT_EQ(e.where(), "data.synthetic.vocab");
  EXPECT_TRUE(contains(e.expected(), "known keys of data.synthetic")) << e.what();
}

TEST(ConfigErrors, SectionsMustBeObjects) {
  InputError e = config_error(json::parse(R"({"train": 3})"));
  EXPECT_EQ(e.where(), "train");
  EXPECT_TRUE(contains(e.expected(), "expected an object")) << e.what();
  e = config_error(json::parse("[1, 2]"));
  EXPECT_EQ(e.where(), "");
  EXPECT_TRUE(contains(e.expected(), "expected a JSON object")) << e.what();
}

TEST(ConfigErrors, WrongTypes) {
  struct Case {
    const char* config;
    const char* where;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"train": {"micro_batch_size": "8"}})", "train.micro_batch_size", "expected an integer"},
      {R"({"train": {"iterations": 2.5}})", "train.iterations", "expected an integer"},
      {R"({"train": {"threads": true}})", "train.threads", "expected an integer or null"},
      {R"({"optimizer": {"lr": "fast"}})", "optimizer.lr", "expected a number"},
      {R"({"model": {"tie_embeddings": 1}})", "model.tie_embeddings", "expected a boolean"},
      {R"({"data": {"path": 3}})", "data.path", "expected a string or null"},
      {R"({"log": {"metrics": ""}})", "log.metrics", "expected a non-empty string or null"},
      {R"({"parallel": {"layers_per_stage": [1, "a"]}})", "parallel.layers_per_stage",
       "expected an array of positive integers or null"},
      {R"({"parallel": {"layers_per_stage": 12}})", "parallel.layers_per_stage",
       "expected an array of positive integers or null"},
      {R"({"parallel": {"schedule": 1}})", "parallel.schedule", "expected one of"},
      {R"({"train": {"seed": -1}})", "train.seed", "expected a non-negative integer"},
      {R"({"checkpoint": {"resume": null}})", "checkpoint.resume", "expected \"auto\", \"none\""},
      {R"({"model": {"preset": 3}})", "model.preset", "expected a string or null"},
  };
  for (const Case& k : cases) {
    const InputError e = config_error(json::parse(k.config));
    EXPECT_EQ(e.file(), kFile) << k.config;
    EXPECT_EQ(e.where(), k.where) << k.config;
    EXPECT_TRUE(contains(e.expected(), k.expected)) << k.config << " -> " << e.what();
  }
}

TEST(ConfigErrors, IntegralFloatsAreIntegers) {
  const Config c = config_from_json(
      json::parse(
          R"({"train": {"micro_batch_size": 8.0, "seed": 1e3}, "model": {"num_layers": 2e0}})"),
      kFile);
  EXPECT_EQ(c.layout.micro_batch_size, 8);
  EXPECT_EQ(c.train.seed, 1000u);
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.resolved["train"]["micro_batch_size"], 8);
}

TEST(ConfigErrors, OutOfRange) {
  struct Case {
    const char* config;
    const char* where;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"train": {"micro_batch_size": -3}})", "train.micro_batch_size",
       "expected a positive integer, got -3"},
      {R"({"model": {"num_layers": 0}})", "model.num_layers", "expected a positive integer"},
      {R"({"parallel": {"tensor": 0}})", "parallel.tensor", "expected a positive integer"},
      {R"({"parallel": {"data": 0}})", "parallel.data", "expected a positive integer or null"},
      {R"({"train": {"iterations": -1}})", "train.iterations", "expected a non-negative integer"},
      {R"({"train": {"eval_iters": 0}})", "train.eval_iters", "expected a positive integer"},
      {R"({"train": {"threads": 0}})", "train.threads", "expected a positive integer or null"},
      {R"({"train": {"iterations": 3000000000}})", "train.iterations", "at most 2147483647"},
      {R"({"log": {"interval": 0}})", "log.interval", "expected a positive integer"},
      {R"({"checkpoint": {"keep": -1}})", "checkpoint.keep", "expected a non-negative integer"},
      {R"({"checkpoint": {"interval": -5}})", "checkpoint.interval",
       "expected a non-negative integer"},
      {R"({"parallel": {"bucket_mb": 0}})", "parallel.bucket_mb", "expected a number > 0"},
      {R"({"comm": {"timeout_s": 0}})", "comm.timeout_s", "expected a number > 0"},
      {R"({"optimizer": {"lr": -1}})", "optimizer.lr", "expected a number >= 0"},
      {R"({"optimizer": {"min_lr": 0.001}})", "optimizer.min_lr", "expected min_lr in [0, lr"},
      {R"({"optimizer": {"beta1": 1.0}})", "optimizer.beta1", "expected a number in [0, 1)"},
      {R"({"optimizer": {"beta2": -0.1}})", "optimizer.beta2", "expected a number in [0, 1)"},
      {R"({"optimizer": {"eps": 0}})", "optimizer.eps", "expected a number > 0"},
      {R"({"optimizer": {"weight_decay": -0.1}})", "optimizer.weight_decay",
       "expected a number >= 0"},
      {R"({"optimizer": {"grad_clip": -1}})", "optimizer.grad_clip", "expected a number >= 0"},
      {R"({"optimizer": {"warmup_iters": -1}})", "optimizer.warmup_iters",
       "expected a non-negative integer"},
      {R"({"model": {"dropout": 1.5}})", "model.dropout", "expected a number in [0, 1)"},
      {R"({"model": {"init_std": 0}})", "model.init_std", "expected a number > 0"},
      {R"({"data": {"val_fraction": 0}})", "data.val_fraction", "expected a number in (0, 1)"},
      {R"({"data": {"val_fraction": 1}})", "data.val_fraction", "expected a number in (0, 1)"},
  };
  for (const Case& k : cases) {
    const InputError e = config_error(json::parse(k.config));
    EXPECT_EQ(e.file(), kFile) << k.config;
    EXPECT_EQ(e.where(), k.where) << k.config;
    EXPECT_TRUE(contains(e.expected(), k.expected)) << k.config << " -> " << e.what();
  }
}

TEST(ConfigErrors, DropoutNotImplemented) {
  const InputError e = config_error(json::parse(R"({"model": {"dropout": 0.1}})"));
  EXPECT_EQ(e.where(), "model.dropout");
  EXPECT_TRUE(contains(e.expected(), "dropout is not implemented; expected 0")) << e.what();
}

TEST(ConfigErrors, BadEnums) {
  const std::map<std::string, std::string> cases = {
      {R"({"model": {"arch": "t5"}})", "model.arch"},
      {R"({"parallel": {"schedule": "pipedream"}})", "parallel.schedule"},
      {R"({"train": {"recompute": "some"}})", "train.recompute"},
      {R"({"train": {"precision": "fp16"}})", "train.precision"},
      {R"({"device": "tpu"})", "device"},
      {R"({"optimizer": {"decay": "step"}})", "optimizer.decay"},
      {R"({"optimizer": {"name": "sgd"}})", "optimizer.name"},
      {R"({"data": {"source": "web"}})", "data.source"},
  };
  for (const auto& [config, where] : cases) {
    const InputError e = config_error(json::parse(config));
    EXPECT_EQ(e.where(), where) << config;
    EXPECT_TRUE(contains(e.expected(), "expected one of \"")) << e.what();
  }
  const InputError e = config_error(json::parse(R"({"parallel": {"schedule": "pipedream"}})"));
  EXPECT_TRUE(contains(e.expected(), "\"zb-h1\", got \"pipedream\"")) << e.what();
}

// ---- consistency ----

TEST(ConfigConsistency, HiddenDivisibleByHeads) {
  const InputError e = config_error(json::parse(R"({"model": {"hidden_size": 100}})"));
  EXPECT_EQ(e.where(), "model.hidden_size");
  EXPECT_TRUE(contains(e.expected(), "hidden_size 100")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "num_heads 12")) << e.what();
}

TEST(ConfigConsistency, LayersPerStage) {
  // Sum differs from num_layers: both numbers named.
  InputError e =
      config_error(json::parse(R"({"parallel": {"pipeline": 2, "layers_per_stage": [5, 5]}})"));
  EXPECT_EQ(e.where(), "parallel.layers_per_stage");
  EXPECT_TRUE(contains(e.expected(), "sums to 10")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "num_layers is 12")) << e.what();
  // Wrong number of entries.
  e = config_error(json::parse(R"({"parallel": {"pipeline": 2, "layers_per_stage": [4, 4, 4]}})"));
  EXPECT_EQ(e.where(), "parallel.layers_per_stage");
  EXPECT_TRUE(contains(e.expected(), "= 2 entries")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "got 3")) << e.what();
  // Zero-layer stages are refused as a type error.
  e = config_error(json::parse(R"({"parallel": {"pipeline": 2, "layers_per_stage": [12, 0]}})"));
  EXPECT_TRUE(contains(e.expected(), "positive integers")) << e.what();
  // An empty split is not the even one (null).
  e = config_error(json::parse(R"({"parallel": {"layers_per_stage": []}})"));
  EXPECT_EQ(e.where(), "parallel.layers_per_stage");
  EXPECT_TRUE(contains(e.expected(), "non-empty")) << e.what();
  // A consistent one, interleaved: p * v entries.
  const Config c = config_from_json(json::parse(R"({"parallel": {"pipeline": 2,
      "virtual_stages": 2, "schedule": "interleaved", "layers_per_stage": [3, 3, 3, 3]}})"),
                                    kFile);
  EXPECT_EQ(c.layout.layers_per_piece.size(), 4u);
  // Without layers_per_stage, every chunk still needs a layer.
  e = config_error(json::parse(R"({"model": {"num_layers": 3}, "parallel": {"pipeline": 4}})"));
  EXPECT_TRUE(contains(e.expected(), "num_layers 3")) << e.what();
}

TEST(ConfigConsistency, VirtualStagesAndInterleaved) {
  InputError e = config_error(json::parse(R"({"parallel": {"pipeline": 2, "virtual_stages": 2}})"));
  EXPECT_EQ(e.where(), "parallel.virtual_stages");
  EXPECT_TRUE(contains(e.expected(), "interleaved")) << e.what();
  e = config_error(json::parse(R"({"parallel": {"schedule": "interleaved"}})"));
  EXPECT_EQ(e.where(), "parallel.schedule");
  EXPECT_TRUE(contains(e.expected(), "pipeline >= 2")) << e.what();
  // One chunk per stage: named at the key the command line just changed, not at a plan.
  e = config_error(json::parse(R"({"parallel": {"pipeline": 2, "virtual_stages": 2,
                                                "schedule": "interleaved"}})"),
                   {"parallel.virtual_stages=1"});
  EXPECT_EQ(e.file(), "<command line>");
  EXPECT_EQ(e.where(), "parallel.virtual_stages");
  EXPECT_TRUE(contains(e.expected(), "virtual_stages >= 2")) << e.what();
}

TEST(ConfigConsistency, GlobalBatchMultipleOfMicro) {
  const InputError e = config_error(json::parse(R"({"train": {"global_batch_size": 30}})"));
  EXPECT_EQ(e.where(), "train.global_batch_size");
  EXPECT_TRUE(contains(e.expected(), "global_batch_size 30")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "micro_batch_size 4")) << e.what();
  // Blames the key set last: here the command line's micro_batch_size.
  const InputError s = config_error(json::object(), {"train.micro_batch_size=5"});
  EXPECT_EQ(s.file(), kCmd);
  EXPECT_EQ(s.where(), "train.micro_batch_size");
}

TEST(ConfigConsistency, DataPathRequiredForFileSources) {
  for (const char* source : {"text", "tokens"}) {
    json j = json::parse(R"({"model": {"vocab_size": 256}})");
    j["data"]["source"] = source;
    const InputError e = config_error(j);
    EXPECT_EQ(e.file(), kFile);
    EXPECT_EQ(e.where(), "data.path");
    EXPECT_TRUE(contains(e.expected(), "expected a string")) << e.what();
  }
}

TEST(ConfigConsistency, DataVocabularyFitsTheModel) {
  InputError e = config_error(json::parse(R"({"model": {"preset": "tiny", "vocab_size": 32}})"));
  EXPECT_TRUE(contains(e.expected(), "synthetic vocab_size 64")) << e.what();
  e = config_error(
      json::parse(R"({"model": {"preset": "tiny"}, "data": {"source": "text", "path": "x.txt"}})"));
  EXPECT_TRUE(contains(e.expected(), ">= 256")) << e.what();
}

// bf16 runs on every device (the CPU backend emulates it in f32, docs/model.md); any other
// precision is refused with the allowed values.
TEST(ConfigConsistency, Bf16OnEveryDeviceOtherPrecisionsRefused) {
  for (const char* dev : {"cpu", "auto", "cuda"}) {
    EXPECT_NO_THROW(config_from_json(
        json::parse(std::string(R"({"train": {"precision": "bf16"}, "device": ")") + dev + "\"}"),
        kFile));
  }
  const InputError e = config_error(json::parse(R"({"train": {"precision": "fp16"}})"));
  EXPECT_EQ(e.where(), "train.precision") << e.what();
  EXPECT_TRUE(contains(e.expected(), "bf16")) << e.what();
}

// cuDNN's fused attention is asked for only where it can run: a GPU, bf16, a head size that is a
// multiple of 8 up to 128. Anywhere else the config names the key instead of falling back.
TEST(ConfigConsistency, CudnnAttentionOnlyWhereCudnnServes) {
  const std::string gpu_bf16 =
      R"("device": "cuda", "train": {"precision": "bf16", "attention_backend": "cudnn"})";
  const Config c = config_from_json(json::parse("{" + gpu_bf16 + "}"), kFile);
  EXPECT_EQ(c.train.attention_backend, "cudnn");
  EXPECT_EQ(Config{}.train.attention_backend, "auto");
  for (const char* v : {"auto", "strata"}) {
    EXPECT_NO_THROW(config_from_json(
        json::parse(std::string(R"({"train": {"attention_backend": ")") + v + "\"}}"), kFile));
  }

  InputError e = config_error(json::parse(R"({"train": {"attention_backend": "flash2"}})"));
  EXPECT_EQ(e.where(), "train.attention_backend") << e.what();
  EXPECT_TRUE(contains(e.expected(), "cudnn")) << e.what();

  e = config_error(json::parse(
      R"({"device": "cpu", "train": {"precision": "bf16", "attention_backend": "cudnn"}})"));
  EXPECT_TRUE(contains(e.expected(), "expected device \"cuda\"")) << e.what();
  e = config_error(json::parse(
      R"({"device": "cuda", "train": {"precision": "fp32", "attention_backend": "cudnn"}})"));
  EXPECT_TRUE(contains(e.expected(), "bf16 only")) << e.what();
  // Head sizes 600 / 8 = 75 (not a multiple of 8) and 2048 / 8 = 256 (over 128).
  e = config_error(
      json::parse("{" + gpu_bf16 + R"(, "model": {"hidden_size": 600, "num_heads": 8}})"));
  EXPECT_TRUE(contains(e.expected(), "head size 75")) << e.what();
  e = config_error(
      json::parse("{" + gpu_bf16 + R"(, "model": {"hidden_size": 2048, "num_heads": 8}})"));
  EXPECT_TRUE(contains(e.expected(), "head size 256")) << e.what();
}

TEST(ConfigConsistency, CheckpointIntervalNeedsDir) {
  const InputError e = config_error(json::parse(R"({"checkpoint": {"interval": 100}})"));
  EXPECT_EQ(e.where(), "checkpoint.dir");
  EXPECT_NO_THROW(
      config_from_json(json::parse(R"({"checkpoint": {"interval": 100, "dir": "ckpt"}})"), kFile));
}

// Issue 28: warmup_iters beyond decay_iters was accepted, and the rate dropped from lr to min_lr
// the step the warm-up ended.
TEST(ConfigConsistency, WarmupWithinDecay) {
  const InputError e =
      config_error(json::parse(R"({"optimizer": {"warmup_iters": 20, "decay_iters": 10}})"));
  EXPECT_EQ(e.file(), kFile);
  EXPECT_EQ(e.where(), "optimizer.warmup_iters");
  EXPECT_TRUE(contains(e.expected(), "warmup_iters 20 > decay_iters 10")) << e.what();
  // The key given last is named.
  EXPECT_EQ(config_error(json::parse(R"({"optimizer": {"warmup_iters": 20}})"),
                         {"optimizer.decay_iters=10"})
                .where(),
            "optimizer.decay_iters");
  for (const char* fine : {R"({"optimizer": {"warmup_iters": 10, "decay_iters": 10}})",
                           R"({"optimizer": {"warmup_iters": 20, "decay_iters": 10,
                                             "decay": "constant"}})",
                           R"({"optimizer": {"warmup_iters": 20}, "train": {"iterations": 5}})"})
    EXPECT_NO_THROW(config_from_json(json::parse(fine), kFile)) << fine;
}

// Megatron-LM's WSD and inverse-square-root schedules (optimizer_param_scheduler.py's get_lr),
// against their closed forms at chosen iterations: lr 1, min_lr 0.1, warm-up 2, decay_iters 10,
// a cool-down of 4 (iterations 7-10).
// From lr 1 to min_lr 0.1 in `decay`'s shape, after `warmup` iterations, ending at `decay_iters`.
OptimizerConfig lr_schedule(const std::string& decay, int warmup, int decay_iters) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_iters = warmup;
  o.decay = decay;
  o.decay_iters = decay_iters;
  return o;
}

TEST(LrSchedule, WarmupStableDecayInEachShape) {
  OptimizerConfig o = lr_schedule("wsd", 2, 10);
  o.wsd_decay_iters = 4;
  const double half = 2 * std::sqrt(0.5) - 1;  // exponential's 2·0.5^r − 1 at r = 1/2
  const std::map<std::string, std::vector<double>> want = {
      // iterations 1, 2, 6, 7, 8, 10, 11
      {"exponential",
       {0.5, 1, 1, 0.1 + 0.9 * (2 * std::pow(0.5, 0.25) - 1), 0.1 + 0.9 * half, 0.1, 0.1}},
      {"linear", {0.5, 1, 1, 0.775, 0.55, 0.1, 0.1}},
      {"cosine", {0.5, 1, 1, 0.1 + 0.45 * (1 + std::cos(M_PI / 4)), 0.55, 0.1, 0.1}},
      {"minus_sqrt", {0.5, 1, 1, 0.55, 0.1 + 0.9 * (1 - std::sqrt(0.5)), 0.1, 0.1}}};
  for (const auto& [style, lrs] : want) {
    o.wsd_decay_style = style;
    const std::vector<int> its = {1, 2, 6, 7, 8, 10, 11};
    for (size_t i = 0; i < its.size(); ++i)
      EXPECT_NEAR(learning_rate(o, 100, its[i]), lrs[i], 1e-12) << style << " at " << its[i];
  }
  // decay_iters null: the cool-down ends at the run's last iteration.
  o.decay_iters.reset();
  o.wsd_decay_style = "linear";
  EXPECT_NEAR(learning_rate(o, 20, 16), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(o, 20, 18), 0.55, 1e-12);
}

TEST(LrSchedule, InverseSquareRoot) {
  OptimizerConfig o = lr_schedule("inverse-square-root", 4, 1000);
  EXPECT_NEAR(learning_rate(o, 1000, 2), 0.5, 1e-12);     // warm-up
  EXPECT_NEAR(learning_rate(o, 1000, 4), 1.0, 1e-12);     // √4 / √4
  EXPECT_NEAR(learning_rate(o, 1000, 16), 0.5, 1e-12);    // √4 / √16
  EXPECT_NEAR(learning_rate(o, 1000, 1000), 0.1, 1e-12);  // √4 / √1000 = 0.063, floored
  o.warmup_iters = 0;
  EXPECT_NEAR(learning_rate(o, 1000, 25), 0.2, 1e-12);  // √1 / √25
  EXPECT_NEAR(learning_rate(o, 1000, 1001), 0.1, 1e-12);
}

// wsd needs its cool-down's length, and a cool-down that starts after the warm-up ends.
TEST(ConfigConsistency, WsdNeedsACooldownAfterTheWarmup) {
  InputError e = config_error(json::parse(R"({"optimizer": {"decay": "wsd"}})"));
  EXPECT_EQ(e.where(), "optimizer.decay");
  EXPECT_TRUE(contains(e.expected(), "the cool-down's iterations")) << e.what();
  e = config_error(json::parse(R"({"optimizer": {"decay": "wsd", "warmup_iters": 5,
                                                 "wsd_decay_iters": 6},
                                   "train": {"iterations": 10}})"));
  EXPECT_TRUE(contains(e.expected(), "warmup_iters + wsd_decay_iters <= decay_iters 10, got 5 + 6"))
      << e.what();
  e = config_error(json::parse(R"({"optimizer": {"decay": "wsd", "wsd_decay_iters": 0}})"));
  EXPECT_EQ(e.where(), "optimizer.wsd_decay_iters");
  e = config_error(json::parse(R"({"optimizer": {"wsd_decay_style": "step"}})"));
  EXPECT_EQ(e.where(), "optimizer.wsd_decay_style");
  EXPECT_NO_THROW(config_from_json(
      json::parse(R"({"optimizer": {"decay": "wsd", "warmup_iters": 4, "wsd_decay_iters": 6},
                      "train": {"iterations": 10}})"),
      kFile));
}

// Issue 28: docs/checkpoints.md (and runtime/checkpoint/checkpoint.h) say checkpoint.keep 0 keeps
// every checkpoint; the parser refused it.
TEST(ConfigConsistency, CheckpointKeepZeroKeepsAll) {
  const Config c = config_from_json(json::parse(R"({"checkpoint": {"keep": 0}})"), kFile);
  EXPECT_EQ(c.checkpoint.keep, 0);
}

// ---- world size ----

Config world_config(const char* text) {
  return config_from_json(json::parse(text), kFile);
}

TEST(ConfigWorld, TensorTimesPipelineDividesWorld) {
  const Config c = world_config(R"({"parallel": {"tensor": 2, "pipeline": 2}})");
  const InputError e = expect_error([&] { validate_for_world(c, 6); });
  EXPECT_EQ(e.file(), kFile);
  EXPECT_TRUE(contains(e.expected(), "world size 6")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "= 4")) << e.what();
  EXPECT_NO_THROW(validate_for_world(c, 8));
  EXPECT_THROW(validate_for_world(c, 2), InputError);  // smaller than t * p
}

TEST(ConfigWorld, ExplicitDataMustMatch) {
  const Config c = world_config(R"({"parallel": {"tensor": 2, "data": 1}})");
  const InputError e = expect_error([&] { validate_for_world(c, 4); });
  EXPECT_EQ(e.where(), "parallel.data");
  EXPECT_EQ(e.expected(), "world size 4 (mpirun -np) != tensor 2 × pipeline 1 × data 1 = 2");
  EXPECT_NO_THROW(validate_for_world(c, 2));
}

// The tensor size the command line just gave is what a mismatch names, not the file's model.
TEST(ConfigWorld, TensorFromTheCommandLineIsBlamed) {
  const Config c =
      config_from_json(json::parse(R"({"model": {"hidden_size": 96, "num_heads": 4}})"), kFile,
                       {"train.seed=3", "parallel.tensor=3"});
  InputError e = expect_error([&] { validate_for_world(c, 3); });
  EXPECT_EQ(e.file(), "<command line>");
  EXPECT_EQ(e.where(), "parallel.tensor");
  EXPECT_TRUE(contains(e.expected(), "num_heads 4 is not divisible by tensor 3")) << e.what();
  // Set in the file, the model's key is named there.
  const Config f =
      world_config(R"({"model": {"hidden_size": 96, "num_heads": 4}, "parallel": {"tensor": 3}})");
  e = expect_error([&] { validate_for_world(f, 3); });
  EXPECT_EQ(e.file(), kFile);
  EXPECT_EQ(e.where(), "model.num_heads");
}

TEST(ConfigWorld, TensorDividesModelSizes) {
  const Config heads =
      world_config(R"({"model": {"hidden_size": 96, "num_heads": 3}, "parallel": {"tensor": 2}})");
  InputError e = expect_error([&] { validate_for_world(heads, 2); });
  EXPECT_EQ(e.where(), "model.num_heads");
  EXPECT_TRUE(contains(e.expected(), "num_heads 3")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "tensor 2")) << e.what();

  const Config ffn =
      world_config(R"({"model": {"ffn_hidden_size": 3071}, "parallel": {"tensor": 2}})");
  e = expect_error([&] { validate_for_world(ffn, 2); });
  EXPECT_EQ(e.where(), "model.ffn_hidden_size");
  EXPECT_TRUE(contains(e.expected(), "3071")) << e.what();

  const Config sp = world_config(
      R"({"model": {"seq_len": 1023}, "parallel": {"tensor": 2, "sequence_parallel": true}})");
  e = expect_error([&] { validate_for_world(sp, 2); });
  EXPECT_TRUE(contains(e.expected(), "seq_len 1023")) << e.what();
}

// Tensor parallelism gives each rank whole key/value heads: a count t does not divide is refused
// with both numbers (Megatron refuses it too), never replicated or rounded.
TEST(ConfigWorld, TensorDividesKeyValueHeads) {
  const Config c = world_config(
      R"({"model": {"preset": "llama-tiny", "num_heads": 8, "num_key_value_heads": 2},
          "parallel": {"tensor": 4}})");
  const InputError e = expect_error([&] { validate_for_world(c, 4); });
  EXPECT_EQ(e.where(), "model.num_key_value_heads");
  EXPECT_TRUE(contains(e.expected(), "num_key_value_heads 2")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "tensor 4")) << e.what();
  EXPECT_NO_THROW(validate_for_world(world_config(R"({"model": {"preset": "llama-tiny"},
                                                      "parallel": {"tensor": 2}})"),
                                     2));
  // GPT has multi-head attention: a key/value head count of its own is refused, not ignored.
  const Config gpt = world_config(R"({"model": {"num_key_value_heads": 4}})");
  const InputError g = expect_error([&] { validate_for_world(gpt, 1); });
  EXPECT_EQ(g.where(), "model.num_key_value_heads");
}

// The Llama keys' own checks: heads a multiple of key/value heads, rope_scaling's fields.
TEST(ConfigErrors, LlamaKeys) {
  InputError e = config_error(json::parse(
      R"({"model": {"preset": "llama-tiny", "num_heads": 4, "num_key_value_heads": 3}})"));
  EXPECT_TRUE(contains(e.expected(), "num_heads 4 is not a multiple of num_key_value_heads 3"))
      << e.what();
  e = config_error(json::parse(R"({"model": {"rope_scaling": {"rope_type": "yarn"}}})"));
  EXPECT_EQ(e.where(), "model.rope_scaling");
  EXPECT_TRUE(contains(e.expected(), "llama3")) << e.what();
  e = config_error(json::parse(
      R"({"model": {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                                      "high_freq_factor": 4}}})"));
  EXPECT_TRUE(contains(e.expected(), "original_max_position_embeddings\" is missing")) << e.what();
  e = config_error(json::parse(R"({"model": {"rope_theta": 0}})"));
  EXPECT_EQ(e.where(), "model.rope_theta");
  const Config ok = load_config("", {"model.preset=llama-3.1-8b"});
  ASSERT_TRUE(ok.model.rope_scaling.has_value());
  EXPECT_EQ(ok.resolved["model"]["rope_scaling"]["factor"], 8.0);
}

// BERT's keys: refused below two token types and on the decoders; the decoder keys refused on
// BERT; data.masked_lm's ranges; no samples from an encoder.
TEST(ConfigErrors, BertKeys) {
  // The architecture's checks run with the world's (validate_for_world).
  const auto arch_error = [](const char* config) {
    const Config c = config_from_json(json::parse(config), kFile);
    return expect_error([&] { validate_for_world(c, 1); });
  };
  InputError e = arch_error(R"({"model": {"preset": "bert-tiny", "type_vocab_size": 1}})");
  EXPECT_EQ(e.where(), "model.type_vocab_size");
  EXPECT_TRUE(contains(e.expected(), "at least 2 for arch \"bert\"")) << e.what();
  e = arch_error(R"({"model": {"preset": "tiny", "type_vocab_size": 3}})");
  EXPECT_EQ(e.where(), "model.type_vocab_size");
  EXPECT_TRUE(contains(e.expected(), "for arch \"gpt\"")) << e.what();
  e = arch_error(R"({"model": {"preset": "llama-tiny", "layer_norm_eps": 1e-5}})");
  EXPECT_EQ(e.where(), "model.layer_norm_eps");
  EXPECT_TRUE(contains(e.expected(), "model.rms_norm_eps")) << e.what();
  e = arch_error(R"({"model": {"preset": "bert-tiny", "tie_embeddings": false}})");
  EXPECT_EQ(e.where(), "model.tie_embeddings");
  e = arch_error(R"({"model": {"preset": "bert-tiny", "num_key_value_heads": 2}})");
  EXPECT_EQ(e.where(), "model.num_key_value_heads");
  e = config_error(json::parse(R"({"data": {"masked_lm": {"mask_prob": 1}}})"));
  EXPECT_EQ(e.where(), "data.masked_lm.mask_prob");
  e = config_error(json::parse(R"({"data": {"masked_lm": {"short_seq_prob": 1}}})"));
  EXPECT_EQ(e.where(), "data.masked_lm.short_seq_prob");
  e = config_error(json::parse(R"({"data": {"masked_lm": {"cls_id": -1}}})"));
  EXPECT_EQ(e.where(), "data.masked_lm.cls_id");
  e = config_error(json::parse(R"({"data": {"masked_lm": {"mask": 0.2}}})"));
  EXPECT_EQ(e.where(), "data.masked_lm.mask");
  e = config_error(
      json::parse(R"({"model": {"preset": "bert-tiny"}, "log": {"sample_interval": 10}})"));
  EXPECT_EQ(e.where(), "log.sample_interval");
  EXPECT_TRUE(contains(e.expected(), "(an encoder)")) << e.what();
  const Config ok = load_config("", {"model.preset=bert-base", "data.masked_lm.sentence_order=true",
                                     "data.masked_lm.mask_id=7"});
  EXPECT_EQ(ok.model.arch, "bert");
  EXPECT_TRUE(ok.data.masked_lm.sentence_order);
  EXPECT_EQ(ok.data.masked_lm.mask_id, 7);
  EXPECT_FALSE(ok.data.masked_lm.cls_id.has_value());
  EXPECT_EQ(ok.resolved["data"]["masked_lm"]["mask_id"], 7);
}

// data.blend: weights ≥ 0 summing above 0, only for tokenized sources, never beside data.path;
// data.tokenizer beside any source.
TEST(ConfigErrors, DataBlendAndTokenizer) {
  InputError e = config_error(json::parse(
      R"({"data": {"source": "indexed", "blend": [{"path": "a", "weight": 1}, {"path": "b", "weight": -1}]}})"));
  EXPECT_EQ(e.where(), "data.blend");
  EXPECT_TRUE(contains(e.expected(), "entry 1 has weight -1")) << e.what();
  e = config_error(json::parse(
      R"({"data": {"source": "indexed", "blend": [{"path": "a", "weight": 0}, {"path": "b", "weight": 0}]}})"));
  EXPECT_TRUE(contains(e.expected(), "sum to 0")) << e.what();
  e = config_error(json::parse(R"({"data": {"source": "indexed", "blend": []}})"));
  EXPECT_EQ(e.where(), "data.blend");
  e = config_error(
      json::parse(R"({"data": {"source": "text", "blend": [{"path": "a", "weight": 1}]}})"));
  EXPECT_TRUE(contains(e.expected(), "\"tokens\" or \"indexed\"")) << e.what();
  e = config_error(json::parse(
      R"({"data": {"source": "indexed", "path": "x", "blend": [{"path": "a", "weight": 1}]}})"));
  EXPECT_TRUE(contains(e.expected(), "either data.path or data.blend")) << e.what();
  // A tokenizer for prompts needs no text data (strata generate --checkpoint ... --set
  // data.tokenizer=..., the default synthetic source).
  EXPECT_EQ(load_config("", {"data.tokenizer=t.json"}).data.tokenizer,
            std::optional<std::string>("t.json"));
  // A tokenized dataset keeps its tokenizer (to decode ids for bits per byte).
  const Config indexed =
      load_config("", {"data.source=indexed", "data.path=x", "data.tokenizer=t.json"});
  EXPECT_EQ(indexed.data.tokenizer, std::optional<std::string>("t.json"));
  const Config ok =
      load_config("", {R"(data.blend=[{"path": "a", "weight": 0.7}, {"path": "b", "weight": 0.3}])",
                       "data.source=indexed"});
  ASSERT_TRUE(ok.data.blend.has_value());
  EXPECT_EQ(ok.data.blend->size(), 2u);
  EXPECT_EQ(ok.resolved["data"]["blend"][1]["weight"], 0.3);
}

TEST(ConfigWorld, GlobalBatchDividesByMicroTimesData) {
  const Config c = world_config(R"({"train": {"micro_batch_size": 4, "global_batch_size": 32}})");
  const InputError e = expect_error([&] { validate_for_world(c, 3); });
  EXPECT_EQ(e.where(), "train.global_batch_size");
  EXPECT_TRUE(contains(e.expected(), "global_batch_size 32")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "micro_batch_size 4")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "data-parallel size 3 = 12")) << e.what();
}

TEST(ConfigWorld, DerivedSizes) {
  const Config c = world_config(R"({"parallel": {"tensor": 2, "pipeline": 2}})");
  EXPECT_EQ(data_parallel_size(c, 8), 2);
  EXPECT_EQ(microbatches_per_pipeline(c, 8), 32 / (4 * 2));
  EXPECT_EQ(data_parallel_size(c, 4), 1);
  EXPECT_EQ(microbatches_per_pipeline(c, 4), 8);
  const Config single = load_config("", {});
  EXPECT_NO_THROW(validate_for_world(single, 1));
  EXPECT_EQ(data_parallel_size(single, 1), 1);
  EXPECT_EQ(microbatches_per_pipeline(single, 1), 8);
  const Config explicit_d = world_config(R"({"parallel": {"data": 4}})");
  EXPECT_EQ(data_parallel_size(explicit_d, 4), 4);
  EXPECT_EQ(microbatches_per_pipeline(explicit_d, 4), 2);
}

// ---- the parallel layout: one table for the config, plan files and --fix ----

// parallel.context and parallel.expert take any positive size in the layout table (config, plan
// files, --fix); what they must divide is checked with the model and the world.
TEST(ConfigLayout, ContextAndExpertAnyPositive) {
  const Config c = load_config("", {"parallel.context=1", "parallel.expert=1"});
  EXPECT_EQ(c.layout.context, 1);
  EXPECT_EQ(c.layout.expert, 1);
  EXPECT_EQ(parse_layout_fixes("context=4").context.value_or(0), 4);
  {
    const InputError e = config_error(json{{"parallel", {{"context", 0}}}});
    EXPECT_EQ(e.file(), kFile);
    EXPECT_EQ(e.where(), "parallel.context");
    const InputError f = expect_error([&] { parse_layout_fixes("context=0"); });
    EXPECT_EQ(f.file(), kCmd);
    EXPECT_EQ(f.where(), "--fix context");
    EXPECT_EQ(f.expected(), e.expected());
  }
  // Expert parallelism takes any positive size here; what it must divide is checked with the
  // model and the world (tests/test_moe.cc).
  EXPECT_EQ(parse_layout_fixes("expert=4").expert.value_or(0), 4);
  const InputError e = config_error(json{{"parallel", {{"expert", 0}}}});
  EXPECT_EQ(e.where(), "parallel.expert");
  const InputError f = expect_error([&] { parse_layout_fixes("expert=0"); });
  EXPECT_EQ(f.where(), "--fix expert");
  EXPECT_EQ(f.expected(), e.expected());
}

// Context parallelism cuts each sequence into 2·context chunks: a length they do not divide is
// refused (never padded), as are the combinations it does not run, each at its key.
TEST(ConfigLayout, ContextChecks) {
  {
    const InputError e = config_error(
        json{{"model", {{"preset", "tiny"}, {"seq_len", 60}}}, {"parallel", {{"context", 4}}}});
    EXPECT_EQ(e.where(), "parallel.context");
    EXPECT_TRUE(contains(e.expected(), "seq_len 60 is not divisible by 2 × context = 8"))
        << e.what();
  }
  // A mixture of experts runs dropless under context parallelism (with expert parallelism too);
  // a capacity, whose drops would depend on the split, is refused.
  {
    EXPECT_NO_THROW(validate_for_world(world_config(R"({"model": {"preset": "mixtral-tiny"},
            "parallel": {"context": 2, "data": 2, "expert": 2}})"),
                                       4));
    const InputError e =
        config_error(json{{"model", {{"preset", "mixtral-tiny"}, {"moe_capacity_factor", 1.25}}},
                          {"parallel", {{"context", 2}}}});
    EXPECT_EQ(e.where(), "parallel.context");
    EXPECT_TRUE(contains(e.expected(), "dropless")) << e.what();
  }
  // The tensor group splits each context rank's positions with sequence parallelism.
  const Config c = world_config(
      R"({"model": {"preset": "tiny", "seq_len": 36}, "parallel": {"context": 2, "tensor": 4,
          "sequence_parallel": true}})");
  const InputError e = expect_error([&] { validate_for_world(c, 8); });
  EXPECT_EQ(e.where(), "parallel.sequence_parallel");
  EXPECT_TRUE(contains(e.expected(), "context × tensor = 8")) << e.what();
  EXPECT_NO_THROW(validate_for_world(world_config(R"({"model": {"preset": "tiny", "seq_len": 64},
      "parallel": {"context": 2, "tensor": 4, "sequence_parallel": true}})"),
                                     8));
}

// The config's layout keys are the layout table's rows: every field is a key of the same path and
// meaning.
TEST(ConfigLayout, EveryLayoutFieldIsAConfigKey) {
  const std::vector<ConfigKey> keys = config_keys();
  for (const LayoutField& f : layout_fields()) {
    const auto it = std::find_if(keys.begin(), keys.end(),
                                 [&f](const ConfigKey& k) { return k.path == f.config_key; });
    ASSERT_NE(it, keys.end()) << f.config_key;
    EXPECT_EQ(it->meaning, f.meaning) << f.config_key;
  }
}

// --fix reads each value as a config reads its key: the same kinds, the same checks, the same
// words, only the place differs (the command line).
TEST(ConfigLayout, FixesReadAsTheConfigDoes) {
  const PinnedLayout p = parse_layout_fixes(
      "tensor=8,schedule=interleaved,sequence_parallel=true,recompute=full,"
      "layers_per_stage=[3,3,2],data=null");
  EXPECT_EQ(p.tensor, 8);
  EXPECT_EQ(p.schedule, ScheduleKind::kInterleaved);
  EXPECT_EQ(p.sequence_parallel, true);
  EXPECT_EQ(p.recompute, Recompute::kFull);
  EXPECT_EQ(p.layers_per_piece, (std::vector<int>{3, 3, 2}));
  EXPECT_FALSE(p.data.has_value());  // null leaves it to the search
  EXPECT_FALSE(p.pipeline.has_value());

  const struct {
    const char* fix;
    json config;  // the same value as a config's key
  } same[] = {
      {"tensor=0", {{"parallel", {{"tensor", 0}}}}},
      {"tensor=99999999999", {{"parallel", {{"tensor", 99999999999LL}}}}},
      {"pipeline=x", {{"parallel", {{"pipeline", "x"}}}}},
      {"schedule=", {{"parallel", {{"schedule", ""}}}}},
      {"sequence_parallel=1", {{"parallel", {{"sequence_parallel", 1}}}}},
      {"layers_per_stage=[2,0]", {{"parallel", {{"layers_per_stage", {2, 0}}}}}},
      {"micro_batch_size=-3", {{"train", {{"micro_batch_size", -3}}}}},
      {"recompute=some", {{"train", {{"recompute", "some"}}}}},
  };
  for (const auto& c : same) {
    const InputError fix = expect_error([&] { parse_layout_fixes(c.fix); });
    const InputError cfg = config_error(c.config);
    EXPECT_EQ(fix.file(), kCmd) << c.fix;
    EXPECT_EQ(fix.where(), "--fix " + cfg.where().substr(cfg.where().find('.') + 1)) << c.fix;
    EXPECT_EQ(fix.expected(), cfg.expected()) << c.fix;
  }

  InputError e = expect_error([] { parse_layout_fixes("nosuch=1"); });
  EXPECT_EQ(e.where(), "--fix nosuch");
  EXPECT_TRUE(contains(e.expected(), "tensor, context, expert, pipeline")) << e.what();
  e = expect_error([] { parse_layout_fixes("tensor"); });
  EXPECT_EQ(e.where(), "--fix");
  e = expect_error([] { parse_layout_fixes("micro_batch_size=1e999"); });
  EXPECT_EQ(e.where(), "--fix micro_batch_size");
}

// ---- files ----

TEST(ConfigFiles, LoadFromDisk) {
  const TempDir dir;
  const std::string path = dir.write("c.json", R"({"train": {"iterations": 9}})");
  const Config c = load_config(path, {"train.seed=5"});
  EXPECT_EQ(c.source_file, path);
  EXPECT_EQ(c.train.iterations, 9);
  EXPECT_EQ(c.train.seed, 5u);

  const std::string bad = dir.write("bad.json", R"({"train": {"micro_batch_size": -3}})");
  const InputError e = expect_error([&] { load_config(bad, {}); });
  EXPECT_EQ(std::string(e.what()),
            "error: " + bad + ": train.micro_batch_size: expected a positive integer, got -3");
}

TEST(ConfigFiles, MissingInvalidAndDuplicateKeys) {
  const TempDir dir;
  InputError e = expect_error([&] { load_config(dir.path() + "/absent.json", {}); });
  EXPECT_EQ(e.file(), dir.path() + "/absent.json");

  const std::string broken = dir.write("broken.json", "{\"train\": {\"iterations\": }}");
  e = expect_error([&] { load_config(broken, {}); });
  EXPECT_EQ(e.file(), broken);
  EXPECT_EQ(e.where().rfind("byte ", 0), 0u) << e.what();

  const std::string dup = dir.write("dup.json", R"({"optimizer": {"lr": 1e-3, "lr": 1e-4}})");
  e = expect_error([&] { load_config(dup, {}); });
  EXPECT_EQ(e.where(), "optimizer.lr");
  EXPECT_TRUE(contains(e.expected(), "duplicate key")) << e.what();
}

// Issue 28: a config nested 70,000 deep overflowed the stack of the error path (json::dump in the
// message) and 50,000 nested objects took 17 s to refuse; nesting is now refused while parsing.
TEST(ConfigFiles, DeepNestingIsRefusedWhileParsing) {
  const TempDir dir;
  const int depth = 200000;
  const std::string arrays =
      dir.write("arrays.json", std::string(depth, '[') + std::string(depth, ']'));
  std::string objects = "{\"model\": ";
  for (int i = 0; i < depth; ++i) objects += "{\"a\": ";
  objects += "1" + std::string(depth + 1, '}');
  const std::string nested = dir.write("objects.json", objects);
  for (const std::string& path : {arrays, nested}) {
    // Refused by the parser's depth limit, before any tree is built (how fast is not a test's
    // business: a timed assertion fails under load and sanitizers).
    const InputError e = expect_error([&] { load_config(path, {}); });
    EXPECT_EQ(e.file(), path);
    EXPECT_TRUE(contains(e.expected(), "nested at most 64 deep")) << e.what();
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
  // --set values too.
  const InputError e = expect_error([&] {
    load_config("", {"model.init_from=" + std::string(100, '[') + std::string(100, ']')});
  });
  EXPECT_EQ(e.file(), kCmd);
  EXPECT_EQ(e.where().rfind("model.init_from", 0), 0u) << e.what();
}

// Issue 28: "lr": 1e999 ended with nlohmann's out_of_range.406 text and exit status 1.
TEST(ConfigFiles, NumberBeyondDoubleNamesItsKey) {
  const TempDir dir;
  const std::string path = dir.write("lr.json", R"({"optimizer": {"lr": 1e999}})");
  InputError e = expect_error([&] { load_config(path, {}); });
  EXPECT_EQ(std::string(e.what()), "error: " + path +
                                       ": optimizer.lr: expected a number within double's "
                                       "range (magnitude below 1.8e308), got 1e999");
  e = expect_error([&] { load_config("", {"optimizer.lr=-1e999"}); });
  EXPECT_EQ(e.file(), kCmd);
  EXPECT_EQ(e.where(), "optimizer.lr");
  EXPECT_TRUE(contains(e.expected(), "got -1e999")) << e.what();
  e = expect_error([&] { load_config("", {"parallel.layers_per_stage=[1, 2e400]"}); });
  EXPECT_EQ(e.where(), "parallel.layers_per_stage[1]");
}

// Issue 28: a key holding \u0000 cut the error line at the NUL.
TEST(ConfigFiles, ControlBytesInMessagesAreEscaped) {
  const TempDir dir;
  const std::string path = dir.write("nul.json", R"({"model": {"a\u0000b\nc": 1}})");
  const InputError e = expect_error([&] { load_config(path, {}); });
  const std::string what = e.what();
  EXPECT_EQ(
      what.rfind("error: " + path + ": model.a\\x00b\\x0ac: unknown key (known keys of model: ", 0),
      0u)
      << what;
  EXPECT_EQ(what.find('\0'), std::string::npos);
  EXPECT_EQ(what.find('\n'), std::string::npos);
  // A value a megabyte long is shown cut short.
  const std::string big = dir.write("big.json", "{\"" + std::string(1 << 20, 'k') + "\": 1}");
  EXPECT_LT(std::string(expect_error([&] { load_config(big, {}); }).what()).size(), 3500u);
}

// Issue 28: --config /dev/zero read until memory ran out and a FIFO blocked forever: a config
// must be a regular file of at most 64 MiB.
TEST(ConfigFiles, OnlyRegularFilesOfASaneSize) {
  const TempDir dir;
  const std::string fifo = dir.path() + "/fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string huge = dir.write("huge.json", "");
  fs::resize_file(huge, (uint64_t{64} << 20) + 1);  // sparse: no disk is written
  const std::pair<std::string, std::string> cases[] = {
      {"/dev/zero", "expected a regular file, got a character device"},
      {fifo, "expected a regular file, got a FIFO"},
      {dir.path(), "expected a regular file, got a directory"},
      {huge, "expected a file of at most 64.00 MiB, got 64.00 MiB (67108865 bytes)"},
  };
  for (const auto& [path, expected] : cases) {
    const InputError e = expect_error([&] { load_config(path, {}); });
    EXPECT_EQ(e.file(), path);
    EXPECT_TRUE(contains(e.expected(), expected)) << e.what();
  }
}

TEST(ConfigFiles, UnknownPresetListsKnownOnes) {
  InputError e = config_error(json::parse(R"({"model": {"preset": "gpt5"}})"));
  EXPECT_EQ(e.file(), kFile);
  EXPECT_EQ(e.where(), "model.preset");
  EXPECT_TRUE(contains(e.expected(), "tiny")) << e.what();
  e = config_error(json::parse(R"({"model": {"preset": "../train/quickstart"}})"));
  EXPECT_EQ(e.where(), "model.preset");
}

// Points STRATA_CONFIGS at a scratch folder for one test.
class ScopedConfigsDir {
 public:
  explicit ScopedConfigsDir(const std::string& dir) { setenv("STRATA_CONFIGS", dir.c_str(), 1); }
  ~ScopedConfigsDir() { unsetenv("STRATA_CONFIGS"); }
};

TEST(ConfigFiles, PresetErrorsNameThePresetFile) {
  const TempDir dir;
  const std::string good = dir.write("models/small.json", R"({"num_layers": 1, "hidden_size": 8,
                                                             "num_heads": 2})");
  const std::string bad = dir.write("models/bad.json", R"({"hidden_sz": 8})");
  const std::string neg = dir.write("models/neg.json", R"({"num_layers": -1})");
  const ScopedConfigsDir scoped(dir.path());
  EXPECT_EQ(configs_dir(), dir.path());

  const Config c = config_from_json(json::parse(R"({"model": {"preset": "small"}})"), kFile);
  EXPECT_EQ(c.model.hidden_size, 8);
  EXPECT_EQ(c.model.ffn_hidden_size, 32);  // the preset gives hidden_size, not ffn

  InputError e = config_error(json::parse(R"({"model": {"preset": "bad"}})"));
  EXPECT_EQ(e.file(), bad);
  EXPECT_EQ(e.where(), "hidden_sz");
  e = config_error(json::object(), {"model.preset=neg"});
  EXPECT_EQ(e.file(), neg);
  EXPECT_EQ(e.where(), "num_layers");
  // The file's key overrides the preset's bad value.
  EXPECT_NO_THROW(
      config_from_json(json::parse(R"({"model": {"preset": "neg", "num_layers": 2}})"), kFile));
}

TEST(ConfigFiles, EveryPresetLoadsWithItsDocumentedSizes) {
  struct Sizes {
    int layers, hidden, heads, seq, vocab, ffn;
    int kv_heads = 0;  // 0: multi-head (GPT)
    bool tie = true;
    double rope_theta = 10000, rope_factor = 0;                // factor 0: no rope_scaling
    int experts = 0, top_k = 2, expert_ffn = 0, head_dim = 0;  // 0 experts: dense
  };
  // GPT-2 (Radford et al. 2019), GPT-3 (Brown et al. 2020, with Megatron's 16 heads for 1.3B
  // and 5120 for 13B), the test models, and Meta's published Llama 3.1/3.2 config.json files
  // (trained at seq 8192; their 131072 positions come from rope_scaling), and BERT (Devlin et
  // al. 2019: base and large with Google's 30522-token WordPiece vocabulary, seq 512).
  const std::map<std::string, Sizes> expected = {
      {"gpt2-124m", {12, 768, 12, 1024, 50257, 3072}},
      {"gpt2-350m", {24, 1024, 16, 1024, 50257, 4096}},
      {"gpt2-774m", {36, 1280, 20, 1024, 50257, 5120}},
      {"gpt2-1.5b", {48, 1600, 25, 1024, 50257, 6400}},
      {"gpt3-1.3b", {24, 2048, 16, 2048, 50257, 8192}},
      {"gpt3-2.7b", {32, 2560, 32, 2048, 50257, 10240}},
      {"gpt3-6.7b", {32, 4096, 32, 2048, 50257, 16384}},
      {"gpt3-13b", {40, 5120, 40, 2048, 50257, 20480}},
      {"gpt3-175b", {96, 12288, 96, 2048, 50257, 49152}},
      {"tiny", {2, 64, 4, 64, 64, 256}},
      {"llama-tiny", {2, 64, 4, 64, 64, 128, 2, false}},
      {"llama-3.2-1b", {16, 2048, 32, 8192, 128256, 8192, 8, true, 500000, 32}},
      {"llama-3.2-3b", {28, 3072, 24, 8192, 128256, 8192, 8, true, 500000, 32}},
      {"llama-3.1-8b", {32, 4096, 32, 8192, 128256, 14336, 8, false, 500000, 8}},
      {"llama-3.1-70b", {80, 8192, 64, 8192, 128256, 28672, 8, false, 500000, 8}},
      {"llama-3.1-405b", {126, 16384, 128, 8192, 128256, 53248, 8, false, 500000, 8}},
      {"bert-tiny", {2, 64, 4, 64, 260, 256}},
      {"bert-base", {12, 768, 12, 512, 30522, 3072}},
      {"bert-large", {24, 1024, 16, 512, 30522, 4096}},
      // Mixtral-8x7B-v0.1 and Qwen3-30B-A3B / Qwen3-235B-A22B's config.json (trained here at seq
      // 4096 of their 32768 / 40960 positions).
      {"mixtral-tiny", {2, 64, 4, 64, 64, 96, 2, false, 1e6, 0, 4, 2, 96}},
      {"mixtral-8x7b", {32, 4096, 32, 4096, 32000, 14336, 8, false, 1e6, 0, 8, 2, 14336}},
      {"qwen3-moe-tiny", {2, 64, 4, 64, 64, 96, 2, false, 1e6, 0, 8, 2, 48, 32}},
      {"qwen3-30b-a3b", {48, 2048, 32, 4096, 151936, 6144, 4, false, 1e6, 0, 128, 8, 768, 128}},
      {"qwen3-235b-a22b", {94, 4096, 64, 4096, 151936, 12288, 4, false, 1e6, 0, 128, 8, 1536, 128}},
      // Qwen2.5-0.5B and Qwen2.5-7B's config.json (trained here at seq 4096 of their 32768 /
      // 131072 positions).
      {"qwen2-tiny", {2, 64, 4, 64, 64, 128, 2, false, 1e6}},
      {"qwen2.5-0.5b", {24, 896, 14, 4096, 151936, 4864, 2, true, 1e6}},
      {"qwen2.5-7b", {28, 3584, 28, 4096, 152064, 18944, 4, false, 1e6}},
      // Mistral-7B-v0.3's config.json (trained here at seq 4096 of its 32768 positions).
      {"mistral-tiny", {2, 64, 4, 64, 64, 128, 2, false, 1e6}},
      {"mistral-7b", {32, 4096, 32, 4096, 32768, 14336, 8, false, 1e6}},
  };
  const auto arch_of = [](const std::string& name, const Sizes& s) -> std::string {
    if (name.rfind("bert-", 0) == 0) return "bert";
    if (name.rfind("qwen2", 0) == 0) return "qwen2";
    if (name.rfind("mistral", 0) == 0) return "mistral";
    if (s.experts) return s.head_dim ? "qwen3_moe" : "mixtral";
    return s.kv_heads ? "llama" : "gpt";
  };
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(configs_dir() + "/models")) {
    if (entry.path().extension() == ".json") found.push_back(entry.path().stem().string());
  }
  EXPECT_EQ(found.size(), expected.size());
  for (const std::string& name : found) {
    SCOPED_TRACE(name);
    const Config c = load_config("", {"model.preset=" + name});
    EXPECT_EQ(c.model.preset, name);
    const auto it = expected.find(name);
    ASSERT_NE(it, expected.end()) << "undocumented preset";
    const Sizes& s = it->second;
    EXPECT_EQ(c.model.arch, arch_of(name, s));
    // BERT's two segments and Hugging Face's LayerNorm epsilon; the defaults elsewhere.
    EXPECT_EQ(c.model.type_vocab_size, 2);
    EXPECT_EQ(c.model.layer_norm_eps, 1e-12);
    EXPECT_EQ(c.model.tie_embeddings, s.tie);
    EXPECT_EQ(c.model.num_layers, s.layers);
    EXPECT_EQ(c.model.hidden_size, s.hidden);
    EXPECT_EQ(c.model.num_heads, s.heads);
    EXPECT_EQ(c.model.kv_heads(), s.kv_heads ? s.kv_heads : s.heads);
    EXPECT_EQ(c.model.seq_len, s.seq);
    EXPECT_EQ(c.model.vocab_size, s.vocab);
    EXPECT_EQ(c.model.ffn_hidden_size, s.ffn);
    EXPECT_EQ(c.model.rope_theta, s.rope_theta);
    EXPECT_EQ(c.model.rope_scaling.has_value(), s.rope_factor > 0);
    EXPECT_EQ(c.model.num_experts, s.experts);
    if (s.experts) {
      EXPECT_EQ(c.model.num_experts_per_tok, s.top_k);
      EXPECT_EQ(c.model.expert_hidden(), s.expert_ffn);
      EXPECT_EQ(c.model.head_size(), s.head_dim ? s.head_dim : s.hidden / s.heads);
    }
    if (c.model.rope_scaling) {
      EXPECT_EQ(c.model.rope_scaling->factor, s.rope_factor);
      EXPECT_EQ(c.model.rope_scaling->low_freq_factor, 1);
      EXPECT_EQ(c.model.rope_scaling->high_freq_factor, 4);
      EXPECT_EQ(c.model.rope_scaling->original_max_position_embeddings, 8192);
    }
  }
}

// Runs in `dir` until destroyed, then back where it was.
class InDirectory {
 public:
  explicit InDirectory(const std::string& dir) : old_(fs::current_path()) { fs::current_path(dir); }
  ~InDirectory() { fs::current_path(old_); }

 private:
  fs::path old_;
};

// A config's relative paths count from its own folder, whatever the current directory; --set's
// from the current directory; absolute paths and resume's keywords stay as they are.
TEST(ConfigPaths, RelativeToTheConfigFilesFolder) {
  const TempDir dir;
  const std::string cfg = dir.write("runs/a/c.json", R"({
    "model": {"init_from": "../hf"},
    "data": {"source": "text", "path": "corpus.txt", "tokenizer": "/abs/tok.json"},
    "checkpoint": {"dir": "ckpt", "resume": "ckpt/iter_4"},
    "log": {"metrics": "out/m.jsonl", "trace": "t.json"}})");
  const std::string folder = dir.path() + "/runs/a";
  const InDirectory elsewhere(fs::temp_directory_path().string());
  const Config c = load_config(cfg, {});
  EXPECT_EQ(*c.model.init_from, folder + "/../hf");
  EXPECT_EQ(*c.data.path, folder + "/corpus.txt");
  EXPECT_EQ(*c.data.tokenizer, "/abs/tok.json");
  EXPECT_EQ(*c.checkpoint.dir, folder + "/ckpt");
  EXPECT_EQ(c.checkpoint.resume, folder + "/ckpt/iter_4");
  EXPECT_EQ(*c.log.metrics, folder + "/out/m.jsonl");
  EXPECT_EQ(*c.log.trace, folder + "/t.json");
  // The resolved JSON (what --dry-run shows, what --plan layers over) holds the same paths.
  EXPECT_EQ(c.resolved["data"]["path"], folder + "/corpus.txt");

  // --set counts from the current directory: kept as typed.
  const Config s = load_config(cfg, {"data.path=typed.txt", "checkpoint.resume=auto"});
  EXPECT_EQ(*s.data.path, "typed.txt");
  EXPECT_EQ(s.checkpoint.resume, "auto");
  EXPECT_EQ(*s.log.metrics, folder + "/out/m.jsonl");
}

TEST(ConfigPaths, NestedConfigNamedRelatively) {
  const TempDir dir;
  dir.write("data/corpus.txt", "text");
  dir.write("configs/train/c.json",
            R"({"data": {"source": "indexed", "blend": [{"path": "../../data/a", "weight": 1},
                                                       {"path": "/abs/b", "weight": 1}]}})");
  const InDirectory root(dir.path());
  const Config c = load_config("configs/train/c.json", {});
  ASSERT_TRUE(c.data.blend);
  EXPECT_EQ((*c.data.blend)[0].path, "configs/train/../../data/a");
  EXPECT_EQ((*c.data.blend)[1].path, "/abs/b");
  // Resolved against the folder, the path reaches the file from here and from anywhere else.
  EXPECT_TRUE(fs::exists("configs/train/../../data/corpus.txt"));

  // A config in the current directory: its paths are the same as typed.
  dir.write("here.json", R"({"data": {"source": "text", "path": "data/corpus.txt"}})");
  EXPECT_EQ(*load_config("here.json", {}).data.path, "data/corpus.txt");
}

// Errors about a relative path say what it counted from (the command boundary adds the note).
TEST(ConfigPaths, ErrorNoteSaysWhatThePathCountsFrom) {
  const TempDir dir;
  const std::string cfg =
      dir.write("sub/c.json", R"({"data": {"source": "indexed", "path": "ds/prefix"},
                        "checkpoint": {"dir": "ck"}})");
  const Config c = load_config(cfg, {"log.metrics=typed/m.jsonl"});
  const std::string folder = dir.path() + "/sub";
  const std::string note =
      " (data.path \"ds/prefix\", relative to the config file's folder " + folder + ")";
  EXPECT_EQ(config_path_note(*c.data.path), note);
  // The files under a path: an indexed prefix's .idx, a checkpoint of checkpoint.dir.
  EXPECT_EQ(config_path_note(*c.data.path + ".idx"), note);
  EXPECT_EQ(config_path_note(folder + "/ck/iter_3/metadata.json"),
            " (checkpoint.dir \"ck\", relative to the config file's folder " + folder + ")");
  EXPECT_EQ(config_path_note("typed/m.jsonl"),
            " (log.metrics \"typed/m.jsonl\", relative to the current directory " +
                fs::current_path().string() + ")");
  // An error at the key (a missing data file is the config's error, at data.path).
  EXPECT_EQ(config_path_note(cfg, "data.path"), note);
  EXPECT_EQ(config_path_note(cfg, "data.source"), "");
  EXPECT_EQ(config_path_note(folder + "/ds/prefixes"), "");
  EXPECT_EQ(config_path_note("/elsewhere/file"), "");
}

TEST(ConfigFiles, TrainingConfigsLoad) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(configs_dir() + "/train")) {
    if (entry.path().extension() != ".json") continue;
    found.push_back(entry.path().stem().string());
    SCOPED_TRACE(entry.path().string());
    const Config c = load_config(entry.path().string(), {});
    // Each runnable config is valid for the world its parallel sizes ask for.
    const int world = c.layout.tensor * c.layout.pipeline * std::max(1, c.layout.data);
    EXPECT_NO_THROW(validate_for_world(c, world));
  }
  EXPECT_GE(found.size(), 2u);

  // The quickstart is the most parallel run the CPU backend supports on 4 ranks.
  const Config q = load_config(configs_dir() + "/train/quickstart.json", {});
  EXPECT_EQ(q.model.preset, "tiny");
  EXPECT_EQ(q.data.source, "synthetic");
  EXPECT_EQ(q.layout.tensor, 2);
  EXPECT_EQ(q.layout.pipeline, 2);
  EXPECT_EQ(q.layout.schedule, ScheduleKind::kInterleaved);
  EXPECT_EQ(q.layout.virtual_stages, 2);
  EXPECT_NO_THROW(validate_for_world(q, 4));

  const Config s = load_config(configs_dir() + "/train/shakespeare.json", {});
  EXPECT_EQ(s.data.source, "text");
  // Relative to configs/train/, so the config runs from any directory.
  EXPECT_EQ(s.data.path.value_or(""),
            configs_dir() + "/train/../../../shared/data/tinyshakespeare.txt");
  EXPECT_EQ(s.model.vocab_size, 256);
  EXPECT_EQ(s.model.seq_len, 64);
  EXPECT_EQ(s.model.hidden_size, 64);
}

}  // namespace
}  // namespace strata
