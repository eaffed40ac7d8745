// The "gpt" entry of the model registry (models/registry.h): GPT-2 as a transformer spec.
#include <cmath>

#include "models/gpt/gpt.h"
#include "models/registry.h"
#include "models/transformer/lm_head.h"
#include "runtime/base/error.h"

namespace strata {

TransformerSpec gpt_spec(const ModelConfig& m) {
  TransformerSpec s = transformer_sizes("gpt", m);
  s.embedding.table = "wte";
  s.embedding.positions = "wpe";
  BlockSpec& b = s.block;
  b.placement = NormPlacement::kPre;
  b.norm = {NormKind::kLayerNorm, 1e-5};
  b.mlp.activation = MlpActivation::kGelu;
  b.names = {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"};
  b.proj_init_std = m.init_std / std::sqrt(2.0 * m.num_layers);  // GPT-2's residual scaling
  s.layer_prefix = "h.";
  s.head = lm_head_spec(b.norm, "ln_f", m.tie_embeddings, "lm_head");
  return s;
}

ArchSpec gpt_arch() {
  ArchSpec a;
  a.name = "gpt";
  a.spec = gpt_spec;
  a.tiny_preset = "tiny";
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
    refuse_moe_keys(m, file);
  };
  a.hf.hf_model_type = "gpt2";
  a.hf.model_config = gpt_model_config_from_hf;
  return a;
}

}  // namespace strata
