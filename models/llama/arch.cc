// The "llama" entry of the model registry (models/registry.h): the Llama family as a transformer
// spec.
#include "models/llama/llama.h"
#include "models/registry.h"
#include "models/transformer/lm_head.h"
#include "runtime/base/error.h"

namespace strata {

TransformerSpec llama_spec(const ModelConfig& m) {
  TransformerSpec s = transformer_sizes("llama", m);
  s.embedding.table = "embed_tokens";
  s.rope_theta = m.rope_theta;
  s.rope_scaling = m.rope_scaling;
  BlockSpec& b = s.block;
  b.placement = NormPlacement::kPre;
  b.norm = {NormKind::kRMSNorm, m.rms_norm_eps};
  b.attention.rotary = true;
  b.attention.bias = false;
  b.mlp.activation = MlpActivation::kSwiGlu;
  b.mlp.bias = false;
  b.names = {"input_layernorm",          "self_attn.qkv_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_up_proj",   "mlp.down_proj"};
  s.layer_prefix = "layers.";
  s.head = lm_head_spec(b.norm, "norm", m.tie_embeddings, "lm_head");
  s.shape_keys["num_key_value_heads"] = m.kv_heads();
  s.shape_keys["rope_theta"] = m.rope_theta;
  s.shape_keys["rope_scaling"] =
      m.rope_scaling ? nlohmann::json(*m.rope_scaling) : nlohmann::json();
  s.shape_keys["rms_norm_eps"] = m.rms_norm_eps;
  return s;
}

ArchSpec llama_arch() {
  ArchSpec a;
  a.name = "llama";
  a.spec = llama_spec;
  a.tiny_preset = "llama-tiny";
  a.grouped_query = true;
  a.hf = HfAdapter{"LlamaForCausalLM", llama_to_hf, llama_from_hf, llama_hf_config,
                   llama_check_hf_config};
  a.hf.hf_order = llama_hf_order;
  a.hf.canonical_name = llama_canonical_name;
  // Rotary embeddings rotate pairs (i, i + head_size/2): the head size must be even.
  a.validate = [](const ModelConfig& m, int, const std::string& file) {
    const int head_size = m.hidden_size / m.num_heads;
    if (head_size % 2 != 0)
      throw InputError(file, "model.hidden_size",
                       "an even head size for rotary embeddings: hidden_size " +
                           std::to_string(m.hidden_size) + " / num_heads " +
                           std::to_string(m.num_heads) + " = " + std::to_string(head_size));
    refuse_encoder_keys(m, file);
  };
  a.hf.hf_model_type = "llama";
  a.hf.model_config = llama_model_config_from_hf;
  return a;
}

}  // namespace strata
