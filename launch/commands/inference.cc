#include "launch/commands/inference.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "launch/config/config_parse.h"
#include "launch/config/model_shape.h"
#include "launch/config/world_layout.h"
#include "launch/train/model_state.h"
#include "models/hf_checkpoint.h"
#include "models/registry.h"
#include "runtime/base/error.h"
#include "runtime/base/operation.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/comm.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

// Generate and eval build tables of model.seq_len positions (rotary angles, a batch of --data):
// a config.json asking for more is refused rather than allocated for minutes.
constexpr int64_t kMaxInferencePositions = int64_t{1} << 20;

// The first of `keys` config.json has (the name its model type gives the size), else keys[0].
std::string hf_key(const nlohmann::json& hf, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (hf.contains(k)) return k;
  return *keys.begin();
}

// A config.json's sizes against its weights' shapes (their headers only), before anything of the
// config's size is built: a config of 100,000 layers with weights for 2, or of 2^31 − 1
// positions, names its key instead of allocating for minutes or dying with std::bad_alloc.
void check_hf_sizes(const ModelConfig& m, const nlohmann::json& hf, const std::string& file,
                    const HfShapes& w) {
  if (m.seq_len > kMaxInferencePositions)
    throw InputError(file, hf_key(hf, {"max_position_embeddings", "n_positions", "n_ctx"}),
                     "at most " + std::to_string(kMaxInferencePositions) +
                         " positions (generate and eval build tables of that many), got " +
                         std::to_string(m.seq_len));
  // Layers: the largest index in "...layers.N." or "...h.N." names, plus one.
  static const std::regex layer(R"((?:^|\.)(?:layers|h)\.(\d{1,9})\.)");
  int64_t layers = 0;
  for (const auto& [name, shape] : w.shapes) {
    std::smatch g;
    if (std::regex_search(name, g, layer)) layers = std::max<int64_t>(layers, std::stoll(g[1]) + 1);
  }
  if (layers != m.num_layers)
    throw InputError(file, hf_key(hf, {"num_hidden_layers", "n_layer"}),
                     "the number of layers the weights hold, " + std::to_string(layers) + " (" +
                         w.listing + "), got " + std::to_string(m.num_layers));
  for (const auto& [name, shape] : w.shapes) {
    const auto ends = [&name](const std::string& tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (!ends("embed_tokens.weight") && !ends("wte.weight")) continue;
    if (shape.size() == 2 && shape[1] != m.hidden_size)
      throw InputError(file, hf_key(hf, {"hidden_size", "n_embd"}),
                       "the width of the weights' " + name + ", " + std::to_string(shape[1]) +
                           ", got " + std::to_string(m.hidden_size));
    if (shape.size() == 2 && shape[0] != m.vocab_size)
      throw InputError(file, "vocab_size",
                       "the rows of the weights' " + name + ", " + std::to_string(shape[0]) +
                           ", got " + std::to_string(m.vocab_size));
  }
}

// The model keys of the source, the path its weights are read from and the file that recorded
// the model (run_state.json, config.json).
ModelConfig model_of(const InferenceSource& s, std::string* path, std::string* recorded,
                     nlohmann::json* run_data) {
  if (s.checkpoint.has_value() == s.hf.has_value())
    throw InputError("<command line>", "--checkpoint",
                     "exactly one of --checkpoint DIR and --hf DIR");
  if (s.hf) {
    *path = *s.hf;
    *recorded = *s.hf + "/config.json";
    if (!is_hf_directory(*s.hf))
      throw InputError(*s.hf, "", "a Hugging Face directory (config.json and safetensors)");
    const std::string file = *s.hf + "/config.json";
    const nlohmann::json hf = read_hf_config(*s.hf);
    const ModelConfig m = checked_model(model_config_from_hf(hf, file), file);
    check_hf_sizes(m, hf, file, read_hf_shapes(*s.hf));
    return m;
  }
  const std::string ck = checkpoint_or_newest(*s.checkpoint, std::cerr);
  *path = ck;
  *recorded = ck + "/run_state.json";
  const CheckpointReader c(ck);  // the headers and the run state, no tensor bytes
  if (s.data_of_run) {
    if (!c.run_state().contains("data"))
      throw InputError(*recorded, "data",
                       "the run's data section for strata eval --data, which this checkpoint "
                       "predates: name the data with --config FILE or --set data.*");
    *run_data = c.run_state().at("data");
  }
  const ModelConfig model =
      config_from_json(nlohmann::json{{"model", c.run_state().at("model")}}, ck + "/run_state.json",
                       {"data.synthetic.vocab_size=1"})
          .model;
  check_checkpoint_holds(model_layout(model, 1, 0, false, whole_model(model.num_layers)), c);
  return model;
}

// The config of the session: the user's keys with one pipeline stage, no sequence parallelism,
// one sequence per data rank, and the source's model keys. A config or --set that names model
// keys must name the source's shape (`recorded` wrote it): a checkpoint of another shape is an
// error, not a silent choice between the two.
Config session_config(const InferenceSource& s, const ModelConfig& model,
                      const std::string& recorded, const nlohmann::json& run_data) {
  std::vector<std::string> sets = s.sets;
  for (const char* k :
       {"parallel.pipeline=1", "parallel.virtual_stages=1", "parallel.schedule=1f1b",
        "parallel.sequence_parallel=false", "parallel.layers_per_stage=null", "parallel.data=null",
        "parallel.expert=1", "parallel.context=1", "train.micro_batch_size=1"})
    sets.push_back(k);
  // The run's data section is read with the source's model, as the run read it; its errors name
  // the run state.
  const auto load = [&](const std::vector<std::string>& with) {
    if (run_data.is_null()) return load_config(s.config, with);
    return config_from_json(nlohmann::json{{"model", model_section(model)}, {"data", run_data}},
                            recorded, with);
  };
  const Config probe = load(sets);
  // The model keys the user named (a preset names them all), compared where they fix shapes.
  std::set<std::string> named;
  bool all = false;
  auto name = [&](const std::string& key) {
    if (key == "preset") all = true;
    named.insert(key);
  };
  if (!s.config.empty()) {
    const nlohmann::json j = read_json_file(s.config);
    if (j.contains("model") && j["model"].is_object())
      for (const auto& [key, value] : j["model"].items()) name(key);
  }
  for (const std::string& kv : s.sets)
    if (kv.rfind("model.", 0) == 0) name(kv.substr(6, kv.find_first_of(".=", 6) - 6));
  nlohmann::json want = model_shape_json(probe.model, *describe_model(probe.model));
  for (auto it = want.begin(); it != want.end();)
    it = all || named.count(it.key()) ? std::next(it) : want.erase(it);
  check_model_shape(want, model_shape_json(model, *describe_model(model)), recorded,
                    s.config.empty() ? "--set" : s.config);
  const int data = std::max(1, world().size / std::max(1, probe.layout.tensor));
  sets.push_back("train.global_batch_size=" + std::to_string(data));
  Config cfg = load(sets);
  cfg.model = model;
  cfg.model.init_from.reset();
  validate_for_world(cfg, world().size);
  return cfg;
}

}  // namespace

std::vector<Flag> source_flags(InferenceSource* s) {
  return {value_flag("--checkpoint", [s](const std::string& v) { s->checkpoint = v; }),
          value_flag("--hf", [s](const std::string& v) { s->hf = v; }),
          text_flag("--config", &s->config),
          value_flag("--set", [s](const std::string& v) { s->sets.push_back(v); })};
}

InferenceSession::InferenceSession(const InferenceSource& source) {
  std::string path, recorded;
  nlohmann::json run_data;  // null unless source.data_of_run
  const ModelConfig model = model_of(source, &path, &recorded, &run_data);
  // Generation and scoring continue text: a causal language model's work.
  if (architecture(model.arch).masked_lm)
    throw InputError(path, "model.arch",
                     "a causal language model (gpt, llama) for strata generate and eval, got \"" +
                         model.arch +
                         "\", an encoder (its validation loss is strata train's "
                         "val_loss)");
  cfg_ = session_config(source, model, recorded, run_data);
  run_ = make_run_layout(cfg_, world().size == 1);
  be_ = make_backend(cfg_.device, run_.threads, cfg_.train.attention_backend);
  groups_ = run_.groups(*be_);
  // The model's sizes are the config's (config.json, or the checkpoint's): bad input when this
  // process cannot hold them.
  with_memory_named({"building the model and loading its weights", path, ""}, [&] {
    model_ = build_model(cfg_.model, run_.model_options(0, groups_), *be_);
    ParamStore& ps = model_->params();
    std::vector<float> host(static_cast<size_t>(ps.numel()));
    if (source.hf) {
      fill_params(ps.layout(), load_hf_model(cfg_.model, path), host, path);
    } else {
      CheckpointReader c(path);  // reads only the tensors this rank holds
      load_params(ps.layout(), c, "param", host);
    }
    be_->upload(ps.params(), host.data());
    ps.params_changed();
  });
  // The tokenizer: the user's data.tokenizer, else the one the checkpoint's run trained with
  // (its copy in the checkpoint), else a Hugging Face directory's tokenizer.json. It becomes
  // data.tokenizer, so that a text source (strata eval --data) reads text as the model did.
  if (!cfg_.data.tokenizer && source.checkpoint) cfg_.data.tokenizer = checkpoint_tokenizer(path);
  std::error_code ec;
  if (!cfg_.data.tokenizer && source.hf && std::filesystem::exists(path + "/tokenizer.json", ec))
    cfg_.data.tokenizer = path + "/tokenizer.json";
  if (cfg_.data.tokenizer) tok_ = Tokenizer::load(*cfg_.data.tokenizer);
}

std::vector<int32_t> InferenceSession::encode(const std::string& text,
                                              const std::string& what) const {
  if (tok_) return tok_->encode(text);
  if (!is_byte_model())
    throw InputError("<command line>", what,
                     "data.tokenizer (--set data.tokenizer=FILE) to tokenize text, for a model of "
                     "vocabulary " +
                         std::to_string(cfg_.model.vocab_size));
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string InferenceSession::decode(const std::vector<int32_t>& ids) const {
  if (tok_) return tok_->decode(ids);
  std::string out;
  if (is_byte_model())
    for (int32_t id : ids) out += static_cast<char>(id & 0xFF);
  return out;
}

}  // namespace strata
