#include "launch/commands/inference.h"

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "launch/config/config_parse.h"
#include "launch/config/model_shape.h"
#include "launch/config/world_layout.h"
#include "launch/train/model_state.h"
#include "models/hf_checkpoint.h"
#include "models/registry.h"
#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/comm.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

// The model keys of the source, the path its weights are read from and the file that recorded
// the model (run_state.json, config.json).
ModelConfig model_of(const InferenceSource& s, std::string* path, std::string* recorded) {
  if (s.checkpoint.has_value() == s.hf.has_value())
    throw InputError("<command line>", "--checkpoint",
                     "exactly one of --checkpoint DIR and --hf DIR");
  if (s.hf) {
    *path = *s.hf;
    *recorded = *s.hf + "/config.json";
    if (!is_hf_directory(*s.hf))
      throw InputError(*s.hf, "", "a Hugging Face directory (config.json and safetensors)");
    const std::string file = *s.hf + "/config.json";
    return checked_model(model_config_from_hf(read_hf_config(*s.hf), file), file);
  }
  std::string ck = *s.checkpoint;
  std::error_code ec;
  if (!std::filesystem::exists(ck + "/metadata.json", ec)) {
    const auto sel = select_checkpoint(ck, "auto", std::cerr);
    if (!sel) throw InputError(ck, "", "a checkpoint or a directory holding a valid one");
    ck = *sel;
  }
  *path = ck;
  *recorded = ck + "/run_state.json";
  const CheckpointReader c(ck);  // the headers and the run state, no tensor bytes
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
                      const std::string& recorded) {
  std::vector<std::string> sets = s.sets;
  for (const char* k :
       {"parallel.pipeline=1", "parallel.virtual_stages=1", "parallel.schedule=1f1b",
        "parallel.sequence_parallel=false", "parallel.layers_per_stage=null", "parallel.data=null",
        "parallel.expert=1", "parallel.context=1", "train.micro_batch_size=1"})
    sets.push_back(k);
  const Config probe = load_config(s.config, sets);
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
  Config cfg = load_config(s.config, sets);
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
  const ModelConfig model = model_of(source, &path, &recorded);
  // Generation and scoring continue text: a causal language model's work.
  if (architecture(model.arch).masked_lm)
    throw InputError(path, "model.arch",
                     "a causal language model (gpt, llama) for strata generate and eval, got \"" +
                         model.arch +
                         "\", an encoder (its validation loss is strata train's "
                         "val_loss)");
  cfg_ = session_config(source, model, recorded);
  run_ = make_run_layout(cfg_, world().size == 1);
  be_ = make_backend(cfg_.device, run_.threads, cfg_.train.attention_backend);
  groups_ = run_.groups(*be_);
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
