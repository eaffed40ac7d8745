#include "models/registry.h"

#include <stdexcept>

#include "models/bert/bert.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "models/mistral/mistral.h"
#include "models/mixtral/mixtral.h"
#include "models/qwen2/qwen2.h"
#include "models/qwen3_moe/qwen3_moe.h"
#include "runtime/base/error.h"

namespace strata {

// One line per architecture folder (docs/architecture.md).
const std::vector<ArchSpec>& architectures() {
  static const std::vector<ArchSpec> all = {gpt_arch(),     llama_arch(),     bert_arch(),
                                            mixtral_arch(), qwen3_moe_arch(), qwen2_arch(),
                                            mistral_arch()};
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

void refuse_moe_keys(const ModelConfig& m, const std::string& file) {
  const ModelConfig d;
  const auto refuse = [&](bool differs, const std::string& key, const std::string& given) {
    if (differs)
      throw InputError(
          file, "model." + key,
          "the default for arch \"" + m.arch +
              "\" (a mixture-of-experts key: arch \"mixtral\" or \"qwen3_moe\"), got " + given);
  };
  refuse(m.num_experts != d.num_experts, "num_experts", std::to_string(m.num_experts));
  refuse(m.num_experts_per_tok != d.num_experts_per_tok, "num_experts_per_tok",
         std::to_string(m.num_experts_per_tok));
  refuse(m.moe_intermediate_size.has_value(), "moe_intermediate_size",
         std::to_string(m.moe_intermediate_size.value_or(0)));
  refuse(m.norm_topk_prob != d.norm_topk_prob, "norm_topk_prob", "false");
  refuse(m.router_aux_loss_coef != d.router_aux_loss_coef, "router_aux_loss_coef",
         nlohmann::json(m.router_aux_loss_coef).dump());
  refuse(m.moe_capacity_factor.has_value(), "moe_capacity_factor",
         nlohmann::json(m.moe_capacity_factor.value_or(0)).dump());
  refuse(m.head_dim.has_value(), "head_dim", std::to_string(m.head_dim.value_or(0)));
  refuse_dense_layer_keys(m, file);
}

void refuse_dense_layer_keys(const ModelConfig& m, const std::string& file) {
  const ModelConfig d;
  const std::string why =
      " for arch \"" + m.arch +
      "\" (Qwen3-MoE's dense layers among its mixtures: arch \"qwen3_moe\"), got ";
  if (m.decoder_sparse_step != d.decoder_sparse_step)
    throw InputError(file, "model.decoder_sparse_step",
                     "the default 1" + why + std::to_string(m.decoder_sparse_step));
  if (m.mlp_only_layers != d.mlp_only_layers)
    throw InputError(file, "model.mlp_only_layers",
                     "the default []" + why + nlohmann::json(m.mlp_only_layers).dump());
}

void validate_moe(const ModelConfig& m, int tensor, const std::string& file) {
  const std::string arch = "arch \"" + m.arch + "\"";
  if (m.num_experts < 1)
    throw InputError(file, "model.num_experts",
                     "at least 1 expert for " + arch + ", got " + std::to_string(m.num_experts));
  if (m.num_experts_per_tok > m.num_experts)
    throw InputError(file, "model.num_experts_per_tok",
                     "at most num_experts " + std::to_string(m.num_experts) + ", got " +
                         std::to_string(m.num_experts_per_tok));
  if (m.expert_hidden() % tensor != 0)
    throw InputError(
        file, m.moe_intermediate_size ? "model.moe_intermediate_size" : "model.ffn_hidden_size",
        "an expert width that parallel.tensor " + std::to_string(tensor) + " divides, got " +
            std::to_string(m.expert_hidden()));
  if (m.head_size() % 2 != 0)
    throw InputError(
        file, m.head_dim ? "model.head_dim" : "model.hidden_size",
        "an even head size for rotary embeddings, got " + std::to_string(m.head_size()));
  // Hugging Face's balancing loss pools the sparse layers' router logits: it needs one (and a
  // model without is a dense one).
  int sparse = 0;
  for (int l = 0; l < m.num_layers; ++l) sparse += m.sparse_layer(l);
  if (sparse == 0)
    throw InputError(
        file, m.mlp_only_layers.empty() ? "model.decoder_sparse_step" : "model.mlp_only_layers",
        "at least one mixture-of-experts layer for " + arch + ": decoder_sparse_step " +
            std::to_string(m.decoder_sparse_step) + " and mlp_only_layers " +
            nlohmann::json(m.mlp_only_layers).dump() + " leave none of the " +
            std::to_string(m.num_layers) + " layers sparse");
  refuse_encoder_keys(m, file);
}

ParamLayout model_layout(const ModelConfig& m, int tensor, int tensor_rank, bool sp,
                         const std::vector<ModelPiece>& pieces, int expert, int expert_rank) {
  return TransformerModel::layout(model_spec(m), tensor, tensor_rank, sp, pieces, expert,
                                  expert_rank);
}

}  // namespace strata
