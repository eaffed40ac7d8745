// The "bert" entry of the model registry (models/registry.h).
#include "models/bert/bert.h"
#include "models/registry.h"
#include "runtime/base/error.h"

namespace strata {

ArchSpec bert_arch() {
  ArchSpec a;
  a.name = "bert";
  a.describe = [](const ModelConfig& m) { return describe_bert(bert_shape(m)); };
  a.build = [](const ModelConfig& m, const ModelOptions& o, Backend& be) -> std::unique_ptr<Model> {
    return std::make_unique<BertModel>(bert_shape(m), o, be);
  };
  a.layout = [](const ModelConfig& m, int t, int r, bool sp,
                const std::vector<ModelPiece>& pieces) {
    return BertModel::layout(bert_shape(m), t, r, sp, pieces);
  };
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
  };
  return a;
}

}  // namespace strata
