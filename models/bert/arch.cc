// The "bert" entry of the model registry (models/registry.h): BERT as a transformer spec.
#include "models/bert/bert.h"
#include "models/registry.h"
#include "runtime/base/error.h"

namespace strata {

TransformerSpec bert_spec(const ModelConfig& m) {
  TransformerSpec s = transformer_sizes("bert", m);
  const NormSpec layer_norm{NormKind::kLayerNorm, m.layer_norm_eps};
  EmbeddingSpec& e = s.embedding;
  e.table = "embeddings.word_embeddings.weight";
  e.positions = "embeddings.position_embeddings.weight";
  e.types = "embeddings.token_type_embeddings.weight";
  e.type_vocab = m.type_vocab_size;
  e.norm = layer_norm;
  e.norm_name = "embeddings.LayerNorm";
  BlockSpec& b = s.block;
  b.placement = NormPlacement::kPost;
  b.norm = layer_norm;
  b.attention.causal = false;
  b.mlp.activation = MlpActivation::kGeluErf;
  b.names = {"attention.output.LayerNorm", "attention.self.qkv", "attention.output.dense",
             "output.LayerNorm",           "intermediate.dense", "output.dense"};
  s.layer_prefix = "encoder.layer.";
  s.head = bert_head_spec(m.layer_norm_eps);
  s.shape_keys["tie_embeddings"] = true;
  s.shape_keys["type_vocab_size"] = m.type_vocab_size;
  s.shape_keys["layer_norm_eps"] = m.layer_norm_eps;
  return s;
}

ArchSpec bert_arch() {
  ArchSpec a;
  a.name = "bert";
  a.spec = bert_spec;
  a.tiny_preset = "bert-tiny";
  a.hf = HfAdapter{"BertForPreTraining", bert_to_hf, bert_from_hf, bert_hf_config,
                   bert_check_hf_config};
  a.hf.hf_order = bert_hf_order;
  a.hf.canonical_name = bert_canonical_name;
  a.hf.hf_model_type = "bert";
  a.hf.model_config = bert_model_config_from_hf;
  a.masked_lm = true;
  // BERT's multi-head attention, learned positions and tied decoder: the Llama keys and an
  // untied head would be ignored, so they are refused instead.
  a.validate = [](const ModelConfig& m, int, const std::string& file) {
    if (m.kv_heads() != m.num_heads)
      throw InputError(file, "model.num_key_value_heads",
                       "null or num_heads " + std::to_string(m.num_heads) +
                           " for arch \"bert\" (multi-head attention), got " +
                           std::to_string(m.kv_heads()));
    if (m.rope_scaling)
      throw InputError(file, "model.rope_scaling",
                       "null for arch \"bert\" (learned positions, no rotary embeddings)");
    if (!m.tie_embeddings)
      throw InputError(file, "model.tie_embeddings",
                       "true for arch \"bert\" (its masked-LM decoder is the word embeddings)");
    if (m.type_vocab_size < 2)
      throw InputError(file, "model.type_vocab_size",
                       "at least 2 for arch \"bert\" (its samples' segments A and B are token "
                       "types 0 and 1), got " +
                           std::to_string(m.type_vocab_size));
    refuse_moe_keys(m, file);
  };
  return a;
}

}  // namespace strata
