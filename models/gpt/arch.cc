// The "gpt" entry of the model registry (models/registry.h).
#include "models/gpt/gpt.h"
#include "models/registry.h"
#include "runtime/base/error.h"

namespace strata {

DecoderShape gpt_shape(const ModelConfig& m) {
  DecoderShape s;
  s.arch = "gpt";
  s.L = m.num_layers;
  s.C = m.hidden_size;
  s.NH = m.num_heads;
  s.KVH = m.num_heads;
  s.F = m.ffn_hidden_size;
  s.S = m.seq_len;
  s.V = m.vocab_size;
  s.tie = m.tie_embeddings;
  s.init_std = m.init_std;
  s.scaled_proj_init = true;
  s.norm = NormKind::kLayerNorm;
  s.learned_positions = true;
  s.mlp = MlpActivation::kGelu;
  s.bias = true;
  s.names = {"wte",  "wpe",      "h.",         "ln_1", "attn.c_attn", "attn.c_proj",
             "ln_2", "mlp.c_fc", "mlp.c_proj", "ln_f", "lm_head"};
  return s;
}

ArchSpec gpt_arch() {
  ArchSpec a;
  a.name = "gpt";
  a.describe = [](const ModelConfig& m) { return describe_decoder(gpt_shape(m)); };
  a.build = [](const ModelConfig& m, const ModelOptions& o, Backend& be) -> std::unique_ptr<Model> {
    return std::make_unique<DecoderModel>(gpt_shape(m), o, be);
  };
  a.layout = [](const ModelConfig& m, int t, int r, bool sp,
                const std::vector<ModelPiece>& pieces) {
    return DecoderModel::layout(gpt_shape(m), t, r, sp, pieces);
  };
  a.hf = HfAdapter{"GPT2LMHeadModel", gpt_to_hf, gpt_from_hf, gpt_hf_config, gpt_check_hf_config};
  a.hf.hf_order = gpt_hf_order;
  a.hf.canonical_name = gpt_canonical_name;
  // GPT-2 has multi-head attention and learned positions: the Llama keys would be ignored, so
  // they are refused instead.
  a.validate = [](const ModelConfig& m, int, const std::string& file) {
    if (m.kv_heads() != m.num_heads)
      throw InputError(file, "model.num_key_value_heads",
                       "null or num_heads " + std::to_string(m.num_heads) +
                           " for arch \"gpt\" (multi-head attention), got " +
                           std::to_string(m.kv_heads()));
    if (m.rope_scaling)
      throw InputError(file, "model.rope_scaling",
                       "null for arch \"gpt\" (learned positions, no rotary embeddings)");
    refuse_encoder_keys(m, file);
  };
  a.hf.hf_model_type = "gpt2";
  a.hf.model_config = gpt_model_config_from_hf;
  return a;
}

}  // namespace strata
