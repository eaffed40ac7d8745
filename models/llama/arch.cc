// The "llama" entry of the model registry (models/registry.h): the Llama family as a transformer
// spec, and the spec and registry entry every member of the family (Mixtral, Qwen3-MoE) builds
// on.
#include <algorithm>

#include "models/llama/llama.h"
#include "models/registry.h"
#include "models/transformer/lm_head.h"
#include "runtime/base/error.h"

namespace strata {

LlamaFamily llama_family() {
  return LlamaFamily{};
}

TransformerSpec llama_family_spec(const LlamaFamily& f, const ModelConfig& m) {
  TransformerSpec s = transformer_sizes(f.arch, m);
  s.embedding.table = "embed_tokens";
  s.rope_theta = m.rope_theta;
  s.rope_scaling = m.rope_scaling;
  BlockSpec& b = s.block;
  b.placement = NormPlacement::kPre;
  b.norm = {NormKind::kRMSNorm, m.rms_norm_eps};
  b.attention.rotary = true;
  b.attention.bias = f.qkv_bias;
  b.attention.proj_bias = false;
  b.mlp.activation = MlpActivation::kSwiGlu;
  b.mlp.bias = false;
  b.names = {"input_layernorm",          "self_attn.qkv_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_up_proj",   "mlp.down_proj"};
  if (f.qk_norm) {
    b.attention.qk_norm = true;
    b.attention.qk_norm_eps = m.rms_norm_eps;
    b.names.q_norm = "self_attn.q_norm";
    b.names.k_norm = "self_attn.k_norm";
  }
  s.layer_prefix = "layers.";
  s.head = lm_head_spec(b.norm, "norm", m.tie_embeddings, "lm_head");
  s.shape_keys["num_key_value_heads"] = m.kv_heads();
  s.shape_keys["rope_theta"] = m.rope_theta;
  s.shape_keys["rope_scaling"] =
      m.rope_scaling ? nlohmann::json(*m.rope_scaling) : nlohmann::json();
  s.shape_keys["rms_norm_eps"] = m.rms_norm_eps;
  if (!f.moe.empty()) {
    MoeSpec& e = b.mlp.moe;
    e.experts = m.num_experts;
    e.top_k = m.num_experts_per_tok;
    e.hidden = m.expert_hidden();
    e.renormalize = f.always_renormalise || m.norm_topk_prob;
    e.aux_coef = m.router_aux_loss_coef;
    e.capacity_factor = m.moe_capacity_factor;
    b.mlp.hidden = e.hidden;
    b.names.router = f.moe + ".gate";
    b.names.mlp_fc = f.moe + ".experts.gate_up_proj";
    b.names.mlp_proj = f.moe + ".experts.down_proj";
    s.shape_keys["num_experts"] = m.num_experts;
    s.shape_keys["num_experts_per_tok"] = m.num_experts_per_tok;
    s.shape_keys["moe_intermediate_size"] = m.expert_hidden();
    s.shape_keys["head_dim"] = m.head_size();
    // Not shapes, but what the model computes and trains on, which an export's config.json
    // carries.
    s.shape_keys["norm_topk_prob"] = m.norm_topk_prob;
    s.shape_keys["router_aux_loss_coef"] = m.router_aux_loss_coef;
  }
  if (f.dense_layers) {
    s.shape_keys["decoder_sparse_step"] = m.decoder_sparse_step;
    s.shape_keys["mlp_only_layers"] = m.mlp_only_layers;
    // The dense layers: the family's SwiGLU MLP of ffn_hidden_size, under Llama's names, in the
    // mixture's slot.
    BlockSpec dense = b;
    dense.mlp.moe = MoeSpec{};
    dense.mlp.hidden = m.ffn_hidden_size;
    dense.names.router.clear();
    dense.names.mlp_fc = "mlp.gate_up_proj";
    dense.names.mlp_proj = "mlp.down_proj";
    std::vector<int> kind(static_cast<size_t>(m.num_layers));
    for (int l = 0; l < m.num_layers; ++l) kind[static_cast<size_t>(l)] = m.sparse_layer(l) ? 0 : 1;
    if (std::count(kind.begin(), kind.end(), 1) > 0) {
      s.variants = {dense};
      s.layer_kind = std::move(kind);
    }
  }
  return s;
}

TransformerSpec llama_spec(const ModelConfig& m) {
  return llama_family_spec(llama_family(), m);
}

ArchSpec llama_family_arch(const LlamaFamily& f,
                           std::function<TransformerSpec(const ModelConfig&)> spec) {
  ArchSpec a;
  a.name = f.arch;
  a.spec = std::move(spec);
  a.grouped_query = true;
  a.hf = HfAdapter{
      f.hf_class,
      [f](const ModelConfig& m, const FullTensors& ours) { return llama_family_to_hf(f, m, ours); },
      [f](const ModelConfig& m, const FullTensors& hf, const std::string& path) {
        return llama_family_from_hf(f, m, hf, path);
      },
      [f](const ModelConfig& m) { return llama_family_hf_config(f, m); },
      [f](const ModelConfig& m, const nlohmann::json& hf, const std::string& path) {
        llama_family_check_hf_config(f, m, hf, path);
      }};
  a.hf.hf_order = [f](const ModelConfig& m) { return llama_family_hf_order(f, m); };
  a.hf.canonical_name = llama_canonical_name;
  a.hf.hf_model_type = f.model_type;
  a.hf.model_config = [f](const nlohmann::json& hf, const std::string& path) {
    return llama_family_model_config_from_hf(f, hf, path);
  };
  // Rotary embeddings rotate pairs (i, i + head_size/2): the head size must be even.
  a.validate = [f](const ModelConfig& m, int tensor, const std::string& file) {
    if (!f.moe.empty()) {
      if (!f.dense_layers) refuse_dense_layer_keys(m, file);
      validate_moe(m, tensor, file);
      if (f.always_renormalise && !m.norm_topk_prob)
        throw InputError(
            file, "model.norm_topk_prob",
            "true for arch \"" + f.arch + "\" (its top-k routing weights are always renormalised)");
      return;
    }
    const int head_size = m.hidden_size / m.num_heads;
    if (head_size % 2 != 0)
      throw InputError(file, "model.hidden_size",
                       "an even head size for rotary embeddings: hidden_size " +
                           std::to_string(m.hidden_size) + " / num_heads " +
                           std::to_string(m.num_heads) + " = " + std::to_string(head_size));
    refuse_encoder_keys(m, file);
    refuse_moe_keys(m, file);
  };
  return a;
}

ArchSpec llama_family_member(const LlamaFamily& f, const std::string& tiny_preset) {
  ArchSpec a = llama_family_arch(f, [f](const ModelConfig& m) { return llama_family_spec(f, m); });
  a.tiny_preset = tiny_preset;
  return a;
}

ArchSpec llama_arch() {
  return llama_family_member(llama_family(), "llama-tiny");
}

}  // namespace strata
