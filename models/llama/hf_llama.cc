// Hugging Face LlamaForCausalLM ↔ our full tensors (registry.h's HfAdapter for "llama").
//
// Both sides store weights (out, in) as nn.Linear does; what differs is fusion and padding:
//   ours                                  Hugging Face
//   embed_tokens (Vp, C)                  model.embed_tokens.weight (V, C), no padded rows
//   layers.{l}.self_attn.qkv_proj.weight  model.layers.{l}.self_attn.{q,k,v}_proj.weight, stacked
//     ((NH + 2·KVH)·HS, C)                  as rows [q (NH·HS) ; k (KVH·HS) ; v (KVH·HS)]
//   layers.{l}.mlp.gate_up_proj.weight    model.layers.{l}.mlp.{gate,up}_proj.weight, stacked as
//     (2F, C)                               rows [gate (F) ; up (F)]
//   layers.{l}.self_attn.o_proj, mlp.down_proj, input_layernorm, post_attention_layernorm, norm
//                                         the same under model.
//   a mixture's layer: <moe>.gate,        <moe>.gate, <moe>.experts.{e}.<gate|up|down>.weight
//     <moe>.experts.gate_up_proj (E·2F, C), one tensor per expert and projection
//     <moe>.experts.down_proj (E·C, F)
//   Qwen3-MoE's dense layers (ModelConfig::sparse_layer false) are Llama's: mlp.gate_up_proj,
//   mlp.down_proj of ffn_hidden_size ↔ mlp.gate_proj, mlp.up_proj, mlp.down_proj.
//   lm_head.weight (Vp, C), untied only   lm_head.weight (V, C); a tied model saves none (as
//                                         save_pretrained drops the shared tensor), or one equal
//                                         to the embedding
// The q_proj and k_proj rows are taken as they are, with no permutation: Strata's RoPE is Hugging
// Face's (rotate_half: dimension i of a head pairs with i + HS/2). Meta's original
// consolidated.pth checkpoints rotate interleaved pairs (2i, 2i+1); HF's conversion script
// (convert_llama_weights_to_hf.py) permutes their q/k rows into the rotate_half order, so any HF
// checkpoint is already in ours, and a Meta checkpoint must go through that script first.
//
// config.json is LlamaConfig's. A directory given to model.init_from must agree on every key
// that fixes a tensor's shape and on the numerics Strata would otherwise silently change
// (rms_norm_eps, rope_theta, rope_scaling, activation, no biases); max_position_embeddings is not
// compared: RoPE has no position table, and training at a shorter model.seq_len is allowed.
#include <algorithm>
#include <cmath>

#include "models/hf_checkpoint.h"
#include "models/llama/llama.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

// The size of one attention head.
int64_t head_size(const ModelConfig& m) {
  return m.head_size();
}

// Rows [e·rows, (e+1)·rows) of a 2-D tensor of E blocks (an expert of a fused experts weight).
FullTensor block_rows(const FullTensor& t, int64_t e, int64_t rows) {
  return hf_rows(t, e * rows, rows);
}

// Hugging Face's name of expert e's projection `which` (0 gate, 1 up, 2 down) in layer prefix h.
std::string expert_name(const LlamaFamily& f, const std::string& h, int64_t e, int which) {
  return h + f.moe + ".experts." + std::to_string(e) + "." + f.experts[static_cast<size_t>(which)] +
         ".weight";
}

// The tensors (2-D, or 1-D: biases) stacked along their first dimension, in order.
FullTensor stack_rows(const std::vector<const FullTensor*>& parts) {
  FullTensor o;
  o.shape = parts.front()->shape;
  o.shape[0] = 0;
  size_t n = 0;
  for (const FullTensor* p : parts) n += p->data.size();
  o.data.reserve(n);
  for (const FullTensor* p : parts) {
    o.shape[0] += p->shape[0];
    o.data.insert(o.data.end(), p->data.begin(), p->data.end());
  }
  return o;
}

std::string layer(int64_t l) {
  return "layers." + std::to_string(l) + ".";
}

// Layer l's MLP is the family's mixture (else Llama's dense SwiGLU MLP: every layer of a dense
// family, Qwen3-MoE's dense layers).
bool sparse(const LlamaFamily& f, const ModelConfig& m, int64_t l) {
  return !f.moe.empty() && m.sparse_layer(static_cast<int>(l));
}

}  // namespace

FullTensors llama_family_to_hf(const LlamaFamily& f, const ModelConfig& m,
                               const FullTensors& ours) {
  const auto get = [&](const std::string& n) -> const FullTensor& { return ours.at(n); };
  const int64_t q = m.num_heads * head_size(m), kv = m.kv_heads() * head_size(m);
  FullTensors hf;
  hf["model.embed_tokens.weight"] = hf_rows(get("embed_tokens"), 0, m.vocab_size);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string o = layer(l), h = "model." + o;
    const FullTensor& qkv = get(o + "self_attn.qkv_proj.weight");
    hf[h + "self_attn.q_proj.weight"] = hf_rows(qkv, 0, q);
    hf[h + "self_attn.k_proj.weight"] = hf_rows(qkv, q, kv);
    hf[h + "self_attn.v_proj.weight"] = hf_rows(qkv, q + kv, kv);
    if (f.qkv_bias) {
      const FullTensor& bias = get(o + "self_attn.qkv_proj.bias");
      hf[h + "self_attn.q_proj.bias"] = hf_rows(bias, 0, q);
      hf[h + "self_attn.k_proj.bias"] = hf_rows(bias, q, kv);
      hf[h + "self_attn.v_proj.bias"] = hf_rows(bias, q + kv, kv);
    }
    if (f.qk_norm)
      for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
        hf[h + n] = get(o + n);
    if (!sparse(f, m, l)) {
      const FullTensor& gate_up = get(o + "mlp.gate_up_proj.weight");
      hf[h + "mlp.gate_proj.weight"] = hf_rows(gate_up, 0, m.ffn_hidden_size);
      hf[h + "mlp.up_proj.weight"] = hf_rows(gate_up, m.ffn_hidden_size, m.ffn_hidden_size);
      hf[h + "mlp.down_proj.weight"] = get(o + "mlp.down_proj.weight");
    } else {
      const int64_t F = m.expert_hidden(), C = m.hidden_size;
      hf[h + f.moe + ".gate.weight"] = get(o + f.moe + ".gate.weight");
      const FullTensor& gate_up = get(o + f.moe + ".experts.gate_up_proj.weight");
      const FullTensor& down = get(o + f.moe + ".experts.down_proj.weight");
      for (int64_t e = 0; e < m.num_experts; ++e) {
        hf[expert_name(f, h, e, 0)] = block_rows(gate_up, 2 * e, F);
        hf[expert_name(f, h, e, 1)] = block_rows(gate_up, 2 * e + 1, F);
        hf[expert_name(f, h, e, 2)] = block_rows(down, e, C);
      }
    }
    for (const char* n :
         {"self_attn.o_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
      hf[h + n] = get(o + n);
  }
  hf["model.norm.weight"] = get("norm.weight");
  if (!m.tie_embeddings) hf["lm_head.weight"] = hf_rows(get("lm_head.weight"), 0, m.vocab_size);
  return hf;
}

FullTensors llama_to_hf(const ModelConfig& m, const FullTensors& ours) {
  return llama_family_to_hf(llama_family(), m, ours);
}

FullTensors llama_family_from_hf(const LlamaFamily& f, const ModelConfig& m, const FullTensors& hf,
                                 const std::string& path) {
  const auto get = [&](const std::string& n,
                       const std::vector<int64_t>& shape) -> const FullTensor& {
    return hf_tensor(hf, n, shape, path);
  };
  const int64_t C = m.hidden_size, F = m.ffn_hidden_size, q = m.num_heads * head_size(m),
                kv = m.kv_heads() * head_size(m);
  FullTensors o;
  const FullTensor& embed = get("model.embed_tokens.weight", {m.vocab_size, C});
  o["embed_tokens"] = embed;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string p = layer(l), h = "model." + p;
    o[p + "self_attn.qkv_proj.weight"] = stack_rows({&get(h + "self_attn.q_proj.weight", {q, C}),
                                                     &get(h + "self_attn.k_proj.weight", {kv, C}),
                                                     &get(h + "self_attn.v_proj.weight", {kv, C})});
    if (f.qkv_bias)
      o[p + "self_attn.qkv_proj.bias"] = stack_rows({&get(h + "self_attn.q_proj.bias", {q}),
                                                     &get(h + "self_attn.k_proj.bias", {kv}),
                                                     &get(h + "self_attn.v_proj.bias", {kv})});
    o[p + "self_attn.o_proj.weight"] = get(h + "self_attn.o_proj.weight", {C, q});
    if (f.qk_norm)
      for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
        o[p + n] = get(h + n, {head_size(m)});
    if (!sparse(f, m, l)) {
      o[p + "mlp.gate_up_proj.weight"] = stack_rows(
          {&get(h + "mlp.gate_proj.weight", {F, C}), &get(h + "mlp.up_proj.weight", {F, C})});
      o[p + "mlp.down_proj.weight"] = get(h + "mlp.down_proj.weight", {C, F});
    } else {
      const int64_t E = m.num_experts, Fe = m.expert_hidden();
      o[p + f.moe + ".gate.weight"] = get(h + f.moe + ".gate.weight", {E, C});
      std::vector<const FullTensor*> gate_up, down;
      for (int64_t e = 0; e < E; ++e) {
        gate_up.push_back(&get(expert_name(f, h, e, 0), {Fe, C}));
        gate_up.push_back(&get(expert_name(f, h, e, 1), {Fe, C}));
        down.push_back(&get(expert_name(f, h, e, 2), {C, Fe}));
      }
      o[p + f.moe + ".experts.gate_up_proj.weight"] = stack_rows(gate_up);
      o[p + f.moe + ".experts.down_proj.weight"] = stack_rows(down);
    }
    o[p + "input_layernorm.weight"] = get(h + "input_layernorm.weight", {C});
    o[p + "post_attention_layernorm.weight"] = get(h + "post_attention_layernorm.weight", {C});
  }
  o["norm.weight"] = get("model.norm.weight", {C});
  if (!m.tie_embeddings) {
    o["lm_head.weight"] = get("lm_head.weight", {m.vocab_size, C});
  } else if (hf.count("lm_head.weight") &&
             get("lm_head.weight", {m.vocab_size, C}).data != embed.data) {
    throw InputError(path, "lm_head.weight",
                     "none, or one equal to model.embed_tokens.weight (model.tie_embeddings is "
                     "true); it differs: an untied model needs model.tie_embeddings false");
  }
  return o;
}

FullTensors llama_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path) {
  return llama_family_from_hf(llama_family(), m, hf, path);
}

nlohmann::json llama_family_hf_config(const LlamaFamily& f, const ModelConfig& m) {
  nlohmann::json scaling = nullptr;
  if (m.rope_scaling) scaling = *m.rope_scaling;  // runtime/base/config.h's to_json
  nlohmann::json c = {
      {"architectures", {f.hf_class}},
      {"model_type", f.model_type},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.ffn_hidden_size},
      {"num_hidden_layers", m.num_layers},
      {"num_attention_heads", m.num_heads},
      {"num_key_value_heads", m.kv_heads()},
      {"head_dim", head_size(m)},
      {"max_position_embeddings", m.seq_len},
      {"vocab_size", m.vocab_size},
      {"rms_norm_eps", m.rms_norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", scaling},
      {"tie_word_embeddings", m.tie_embeddings},
      {"attention_dropout", m.dropout},
      {"hidden_act", "silu"},
      {"initializer_range", m.init_std},
      {"dtype", "float32"},  // transformers ≥ 4.56 reads "dtype", earlier "torch_dtype"
      {"torch_dtype", "float32"}};
  if (f.qkv_bias) {  // Qwen2Config: the biases are the class's; full attention
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = m.num_layers;
    return c;
  }
  c["attention_bias"] = false;
  if (f.sliding_window) c["sliding_window"] = nullptr;
  if (f.moe.empty()) {
    c["mlp_bias"] = false;
    return c;
  }
  // What the mixture adds; from_pretrained returns the router's logits and adds the balancing
  // loss when output_router_logits is true, as Strata's training objective does with a
  // coefficient above 0.
  c["num_experts_per_tok"] = m.num_experts_per_tok;
  c["router_aux_loss_coef"] = m.router_aux_loss_coef;
  c["output_router_logits"] = m.router_aux_loss_coef > 0;
  if (f.always_renormalise) {  // MixtralConfig: the experts' width is intermediate_size
    c["num_local_experts"] = m.num_experts;
    c["intermediate_size"] = m.expert_hidden();
    c["router_jitter_noise"] = 0.0;
  } else {  // Qwen3MoeConfig: its dense layers' width is intermediate_size (ffn_hidden_size)
    c["num_experts"] = m.num_experts;
    c["moe_intermediate_size"] = m.expert_hidden();
    c["norm_topk_prob"] = m.norm_topk_prob;
    c["decoder_sparse_step"] = m.decoder_sparse_step;
    c["mlp_only_layers"] = m.mlp_only_layers;
    c["use_sliding_window"] = false;
    c["max_window_layers"] = m.num_layers;
  }
  return c;
}

nlohmann::json llama_hf_config(const ModelConfig& m) {
  return llama_family_hf_config(llama_family(), m);
}

std::optional<std::string> llama_canonical_name(const std::string& name) {
  // Older LlamaForCausalLM files carry each layer's rotary inv_freq buffer: not a parameter.
  const std::string buffer = "rotary_emb.inv_freq";
  if (name.size() >= buffer.size() &&
      name.compare(name.size() - buffer.size(), buffer.size(), buffer) == 0)
    return std::nullopt;
  return name;
}

std::vector<std::string> llama_family_hf_order(const LlamaFamily& f, const ModelConfig& m) {
  std::vector<std::string> names = {"model.embed_tokens.weight"};
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string h = "model." + layer(l);
    for (const char* n : {"q", "k", "v"}) {
      names.push_back(h + "self_attn." + n + "_proj.weight");
      if (f.qkv_bias) names.push_back(h + "self_attn." + n + "_proj.bias");
    }
    names.push_back(h + "self_attn.o_proj.weight");
    if (f.qk_norm)
      for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
        names.push_back(h + n);
    if (!sparse(f, m, l)) {
      for (const char* n : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
        names.push_back(h + n);
    } else {
      names.push_back(h + f.moe + ".gate.weight");
      for (int64_t e = 0; e < m.num_experts; ++e)
        for (int which : f.expert_order) names.push_back(expert_name(f, h, e, which));
    }
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"})
      names.push_back(h + n);
  }
  names.push_back("model.norm.weight");
  if (!m.tie_embeddings) names.push_back("lm_head.weight");
  return names;
}

std::vector<std::string> llama_hf_order(const ModelConfig& m) {
  return llama_family_hf_order(llama_family(), m);
}

namespace {

// Qwen3MoeConfig's mlp_only_layers: distinct layer indices in [0, num_hidden_layers); absent or
// null, none. (transformers would ignore an index beyond the layers; Strata refuses it, as its
// config does.)
std::vector<int> hf_dense_layers(const nlohmann::json& hf, int num_layers,
                                 const std::string& path) {
  const nlohmann::json v = hf_value(hf, "mlp_only_layers", nlohmann::json::array());
  const std::string expected = "a list of distinct layer indices in [0, num_hidden_layers " +
                               std::to_string(num_layers) + "), found " + v.dump();
  if (!v.is_array()) throw InputError(path, "mlp_only_layers", expected);
  std::vector<int> out;
  for (const nlohmann::json& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= num_layers ||
        std::find(out.begin(), out.end(), x.get<int64_t>()) != out.end())
      throw InputError(path, "mlp_only_layers", expected);
    out.push_back(x.get<int>());
  }
  return out;
}

// The mixture's keys of a Mixtral or Qwen3-MoE config.json against the model config. Absent keys
// take the class's defaults.
void check_moe_keys(const LlamaFamily& f, const ModelConfig& m, const nlohmann::json& hf,
                    const std::string& path) {
  if (f.always_renormalise) {  // MixtralConfig
    const nlohmann::json local = hf_value(hf, "num_local_experts", hf_value(hf, "num_experts", 8));
    check_hf_key(hf, hf.contains("num_local_experts") ? "num_local_experts" : "num_experts",
                 m.num_experts, "model.num_experts", path, local);
    check_hf_key(hf, "intermediate_size", m.expert_hidden(), "model.moe_intermediate_size", path,
                 14336);
    check_hf_key(hf, "router_jitter_noise", 0.0, "Strata's router, without jitter,", path, 0.0);
  } else {  // Qwen3MoeConfig
    check_hf_key(hf, "num_experts", m.num_experts, "model.num_experts", path, 128);
    check_hf_key(hf, "moe_intermediate_size", m.expert_hidden(), "model.moe_intermediate_size",
                 path, 768);
    check_hf_key(hf, "norm_topk_prob", m.norm_topk_prob, "model.norm_topk_prob", path, false);
    check_hf_key(hf, "decoder_sparse_step", m.decoder_sparse_step, "model.decoder_sparse_step",
                 path, 1);
    // The same layers dense, in whatever order.
    std::vector<int> dense = hf_dense_layers(hf, m.num_layers, path), want = m.mlp_only_layers;
    std::sort(dense.begin(), dense.end());
    std::sort(want.begin(), want.end());
    if (dense != want)
      throw InputError(path, "mlp_only_layers",
                       nlohmann::json(m.mlp_only_layers).dump() +
                           " (model.mlp_only_layers of the model config), found " +
                           hf_value(hf, "mlp_only_layers", nlohmann::json::array()).dump());
    // The dense layers' width.
    bool any_dense = false;
    for (int l = 0; l < m.num_layers; ++l) any_dense = any_dense || !m.sparse_layer(l);
    if (any_dense)
      check_hf_key(hf, "intermediate_size", m.ffn_hidden_size, "model.ffn_hidden_size", path, 6144);
    check_hf_key(hf, "use_sliding_window", false, "Strata's full attention", path, false);
  }
  check_hf_key(hf, "num_experts_per_tok", m.num_experts_per_tok, "model.num_experts_per_tok", path,
               f.always_renormalise ? 2 : 8);
}

}  // namespace

void llama_family_check_hf_config(const LlamaFamily& f, const ModelConfig& m,
                                  const nlohmann::json& hf, const std::string& path) {
  // Absent (or null) keys take the class's defaults (LlamaConfig's), as from_pretrained would.
  check_hf_key(hf, "model_type", f.model_type, "model.arch \"" + f.arch + "\"", path, f.model_type);
  check_hf_key(hf, "num_hidden_layers", m.num_layers, "model.num_layers", path, 32);
  check_hf_key(hf, "hidden_size", m.hidden_size, "model.hidden_size", path, 4096);
  check_hf_key(hf, "num_attention_heads", m.num_heads, "model.num_heads", path, 32);
  const nlohmann::json heads = hf_value(hf, "num_attention_heads", 32);
  check_hf_key(hf, "num_key_value_heads", m.kv_heads(), "model.num_key_value_heads", path, heads);
  check_hf_key(hf, "head_dim", head_size(m),
               m.head_dim ? "model.head_dim" : "hidden_size / num_heads", path,
               hf_int(hf, "hidden_size", 4096, path) / hf_int(hf, "num_attention_heads", 32, path));
  if (f.moe.empty())
    check_hf_key(hf, "intermediate_size", m.ffn_hidden_size, "model.ffn_hidden_size", path, 11008);
  else
    check_moe_keys(f, m, hf, path);
  check_hf_key(hf, "vocab_size", m.vocab_size, "model.vocab_size", path, 32000);
  check_hf_key(hf, "tie_word_embeddings", m.tie_embeddings, "model.tie_embeddings", path, false);
  check_hf_key(hf, "rms_norm_eps", m.rms_norm_eps, "model.rms_norm_eps", path, 1e-6);
  check_hf_key(hf, "hidden_act", "silu", "Strata's SwiGLU", path, "silu");
  const nlohmann::json window = hf_value(hf, "sliding_window", nullptr);
  if (f.sliding_window && !window.is_null() &&
      !(window.is_number_integer() && window.get<int64_t>() >= m.seq_len))
    throw InputError(path, "sliding_window",
                     "null or at least model.seq_len " + std::to_string(m.seq_len) +
                         " (Strata's attention sees every earlier position), found " +
                         window.dump());
  if (f.qkv_bias) {  // Qwen2Config: q/k/v biases always; a sliding window Strata does not do
    check_hf_key(hf, "use_sliding_window", false, "Strata's full attention", path, false);
  } else {
    check_hf_key(hf, "attention_bias", false, "Strata's Llama, without biases,", path, false);
    check_hf_key(hf, "mlp_bias", false, "Strata's Llama, without biases,", path, false);
  }

  // RoPE: transformers before v5 writes rope_theta and rope_scaling; v5 writes rope_parameters
  // ({"rope_type": "default" | "llama3", "rope_theta", and the scaling's keys}).
  const nlohmann::json params = hf_value(hf, "rope_parameters", nullptr);
  const bool v5 = params.is_object();
  const std::string where = v5 ? "rope_parameters" : "rope_scaling";
  const nlohmann::json scaling = v5 ? params : hf_value(hf, "rope_scaling", nullptr);
  if (v5)
    check_hf_key(params, "rope_theta", m.rope_theta, "model.rope_theta", path, 10000.0);
  else
    check_hf_key(hf, "rope_theta", m.rope_theta, "model.rope_theta", path, 10000.0);
  if (!scaling.is_null() && !scaling.is_object())
    throw InputError(path, where, "null or an object, found " + scaling.dump());
  const auto text = [](const nlohmann::json& j) {
    return j.is_string() ? j.get<std::string>() : j.dump();
  };
  std::string type = "default";
  if (scaling.contains("rope_type"))
    type = text(scaling["rope_type"]);
  else if (scaling.contains("type"))  // the key's name before transformers 4.43
    type = text(scaling["type"]);
  if (type != "default" && type != "llama3")
    throw InputError(
        path, where + ".rope_type",
        "\"llama3\" or none (the RoPE scalings Strata implements), found \"" + type + "\"");
  if (!m.rope_scaling) {
    if (type == "llama3")
      throw InputError(path, where,
                       "no RoPE scaling (model.rope_scaling of the model config is null), found "
                       "rope_type \"llama3\"");
    return;
  }
  if (type != "llama3")
    throw InputError(path, where,
                     "rope_type \"llama3\" (model.rope_scaling of the model config), found none");
  const RopeScaling& r = *m.rope_scaling;
  const auto check = [&](const char* key, const nlohmann::json& want) {
    try {
      check_hf_key(scaling, key, want, std::string("model.rope_scaling.") + key, path, nullptr);
    } catch (const InputError& e) {
      throw InputError(path, where + "." + key, e.expected());
    }
  };
  check("factor", r.factor);
  check("low_freq_factor", r.low_freq_factor);
  check("high_freq_factor", r.high_freq_factor);
  check("original_max_position_embeddings", r.original_max_position_embeddings);
}

void llama_check_hf_config(const ModelConfig& m, const nlohmann::json& hf,
                           const std::string& path) {
  llama_family_check_hf_config(llama_family(), m, hf, path);
}

ModelConfig llama_family_model_config_from_hf(const LlamaFamily& f, const nlohmann::json& hf,
                                              const std::string& path) {
  ModelConfig m;
  m.arch = f.arch;
  m.preset = "";
  m.num_layers = hf_int(hf, "num_hidden_layers", 32, path);
  m.hidden_size = hf_int(hf, "hidden_size", 4096, path);
  m.num_heads = hf_int(hf, "num_attention_heads", 32, path);
  m.num_key_value_heads = hf_int(hf, "num_key_value_heads", m.num_heads, path);
  // (Qwen3MoeConfig's default width of its dense layers is 6144, LlamaConfig's 11008.)
  m.ffn_hidden_size = hf_int(hf, "intermediate_size", f.dense_layers ? 6144 : 11008, path);
  m.seq_len = hf_int(hf, "max_position_embeddings", 2048, path);
  m.vocab_size = hf_int(hf, "vocab_size", 32000, path);
  m.tie_embeddings = hf_bool(hf, "tie_word_embeddings", false, path);
  m.rms_norm_eps = hf_number(hf, "rms_norm_eps", 1e-6, path);
  m.init_std = hf_number(hf, "initializer_range", 0.02, path);
  // RoPE: transformers 5's rope_parameters, or rope_theta and rope_scaling before it.
  const nlohmann::json params = hf_value(hf, "rope_parameters", nullptr);
  const nlohmann::json& scaling =
      params.is_object() ? params : hf_value(hf, "rope_scaling", nullptr);
  m.rope_theta = params.is_object() ? hf_number(params, "rope_theta", 10000.0, path)
                                    : hf_number(hf, "rope_theta", 10000.0, path);
  const nlohmann::json type =
      scaling.is_object() ? hf_value(scaling, "rope_type", hf_value(scaling, "type", nullptr))
                          : nlohmann::json();
  if (type == "llama3") {
    RopeScaling r;
    r.factor = hf_number(scaling, "factor", 8.0, path);
    r.low_freq_factor = hf_number(scaling, "low_freq_factor", 1.0, path);
    r.high_freq_factor = hf_number(scaling, "high_freq_factor", 4.0, path);
    r.original_max_position_embeddings =
        hf_int(scaling, "original_max_position_embeddings", 8192, path);
    m.rope_scaling = r;
  }
  const int head_dim = hf_int(hf, "head_dim", m.hidden_size / m.num_heads, path);
  if (head_dim != m.hidden_size / m.num_heads) m.head_dim = head_dim;
  if (!f.moe.empty()) {
    const bool mixtral = f.always_renormalise;
    m.num_experts = mixtral && hf.contains("num_local_experts")
                        ? hf_int(hf, "num_local_experts", 8, path)
                        : hf_int(hf, "num_experts", mixtral ? 8 : 128, path);
    m.num_experts_per_tok = hf_int(hf, "num_experts_per_tok", mixtral ? 2 : 8, path);
    m.moe_intermediate_size =
        mixtral ? m.ffn_hidden_size : hf_int(hf, "moe_intermediate_size", 768, path);
    m.norm_topk_prob = mixtral || hf_bool(hf, "norm_topk_prob", false, path);
    m.router_aux_loss_coef = hf_number(hf, "router_aux_loss_coef", 0.001, path);
  }
  if (f.dense_layers) {
    m.decoder_sparse_step = hf_int(hf, "decoder_sparse_step", 1, path);
    m.mlp_only_layers = hf_dense_layers(hf, m.num_layers, path);
  }
  // What Strata's model does not do (biases, other RoPE, sliding windows, …).
  llama_family_check_hf_config(f, m, hf, path);
  return m;
}

ModelConfig llama_model_config_from_hf(const nlohmann::json& hf, const std::string& path) {
  return llama_family_model_config_from_hf(llama_family(), hf, path);
}

}  // namespace strata
