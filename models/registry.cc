#include "models/registry.h"

#include <stdexcept>

#include "models/bert/bert.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "runtime/base/error.h"

namespace strata {

// One line per architecture folder (docs/architecture.md).
const std::vector<ArchSpec>& architectures() {
  static const std::vector<ArchSpec> all = {gpt_arch(), llama_arch(), bert_arch()};
  return all;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const ArchSpec& a : architectures()) names.push_back(a.name);
  return names;
}

const ArchSpec& architecture(const std::string& name) {
  for (const ArchSpec& a : architectures())
    if (a.name == name) return a;
  throw std::invalid_argument("no model architecture named \"" + name + "\"");
}

TransformerSpec model_spec(const ModelConfig& m) {
  const ArchSpec& a = architecture(m.arch);
  TransformerSpec s = a.spec(m);
  s.masked_lm = a.masked_lm;
  return s;
}

std::unique_ptr<ModelDescription> describe_model(const ModelConfig& m) {
  return describe_transformer(model_spec(m));
}

std::unique_ptr<Model> build_model(const ModelConfig& m, const ModelOptions& o, Backend& backend) {
  return std::make_unique<TransformerModel>(model_spec(m), o, backend);
}

ModelConfig model_config_from_hf(const nlohmann::json& hf, const std::string& path) {
  const nlohmann::json model_type =
      hf.is_object() ? hf.value("model_type", nlohmann::json()) : nullptr;
  const std::string type =
      model_type.is_string() ? model_type.get<std::string>() : model_type.dump();
  std::string known;
  for (const ArchSpec& a : architectures()) {
    if (!a.hf.model_config) continue;
    if (a.hf.hf_model_type == type) return a.hf.model_config(hf, path);
    known += (known.empty() ? "\"" : ", \"") + a.hf.hf_model_type + "\"";
  }
  throw InputError(path, "model_type", "one of " + known + ", found \"" + type + "\"");
}

void refuse_encoder_keys(const ModelConfig& m, const std::string& file) {
  const ModelConfig defaults;
  if (m.type_vocab_size != defaults.type_vocab_size)
    throw InputError(file, "model.type_vocab_size",
                     "the default " + std::to_string(defaults.type_vocab_size) + " for arch \"" +
                         m.arch + "\" (token types are BERT's), got " +
                         std::to_string(m.type_vocab_size));
  if (m.layer_norm_eps != defaults.layer_norm_eps)
    throw InputError(file, "model.layer_norm_eps",
                     "the default 1e-12 for arch \"" + m.arch +
                         "\" (BERT's key: GPT-2's LayerNorm eps is 1e-5, Llama's RMSNorm takes "
                         "model.rms_norm_eps)");
}

ParamLayout model_layout(const ModelConfig& m, int tensor, int tensor_rank, bool sp,
                         const std::vector<ModelPiece>& pieces) {
  return TransformerModel::layout(model_spec(m), tensor, tensor_rank, sp, pieces);
}

}  // namespace strata
