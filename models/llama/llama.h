// llama.h — the Llama family (the "llama" architecture: Llama 2, 3, 3.1, 3.2 and their kin): a
// pre-norm transformer (models/transformer/) with RMSNorm (model.rms_norm_eps), rotary position
// embeddings (model.rope_theta, Llama 3.1's model.rope_scaling), a SwiGLU MLP, grouped-query
// attention (model.num_key_value_heads), no biases, and the LM head untied unless
// model.tie_embeddings (Llama 3.2 1B/3B tie it). Initialisation is Hugging Face's: every weight
// N(0, init_std) (initializer_range), RMSNorm weights 1.
//
// Parameter names are Hugging Face's LlamaForCausalLM without the `model.` prefix, with q/k/v and
// gate/up fused: embed_tokens, layers.{l}.input_layernorm, layers.{l}.self_attn.qkv_proj (rows
// [q_proj; k_proj; v_proj]), layers.{l}.self_attn.o_proj, layers.{l}.post_attention_layernorm,
// layers.{l}.mlp.gate_up_proj (rows [gate_proj; up_proj]), layers.{l}.mlp.down_proj, norm,
// [lm_head]. Rotary convention: Hugging Face's (models/layers/rope.h), so its q/k rows are taken
// as they are.
//
// Hugging Face interop (models/llama/hf_llama.cc): LlamaForCausalLM's state dict and config.json
// ↔ our full tensors and model config.
//
// Thread-safety: pure functions.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/layers/params.h"
#include "models/transformer/transformer.h"
#include "runtime/base/config.h"

namespace strata {

// What a Llama-family Hugging Face class changes of LlamaForCausalLM: Mixtral and Qwen3-MoE are
// Llama's block with a mixture of experts for its MLP (models/layers/moe.h), Qwen3 adds QK-norm,
// Qwen2 biases on q, k and v; Mistral is Llama under its own names (without a sliding window).
// One spec builder and one Hugging Face adapter serve the family.
struct LlamaFamily {
  std::string arch = "llama";  // model.arch
  std::string model_type = "llama", hf_class = "LlamaForCausalLM";
  bool qk_norm = false;  // self_attn.q_norm / self_attn.k_norm (Qwen3), epsilon rms_norm_eps
  // Biases on q_proj, k_proj and v_proj (not o_proj), and Qwen2Config's sliding-window keys
  // (use_sliding_window false) in config.json: Qwen2 and Qwen2.5.
  bool qkv_bias = false;
  // config.json's sliding_window (MistralConfig, MixtralConfig): null, or at least model.seq_len
  // (Strata's attention sees every earlier position; a window is not implemented).
  bool sliding_window = false;
  // A mixture of experts: its module's name in a layer ("block_sparse_moe" for Mixtral, "mlp"
  // for Qwen3-MoE; "" a dense MLP), and Hugging Face's names of expert e's gate, up and down
  // projections under <moe>.experts.<e>. (Mixtral: w1, w3, w2).
  std::string moe;
  std::vector<std::string> experts;
  // The order an expert's module declares its projections in (save_pretrained's order), as
  // indices into `experts` (Mixtral's w1, w2, w3 are gate, down, up).
  std::vector<int> expert_order = {0, 1, 2};
  // The top-k weights are always renormalised (Mixtral), not as model.norm_topk_prob says.
  bool always_renormalise = false;
  // Layers with a dense MLP among the mixtures (Qwen3-MoE's model.decoder_sparse_step and
  // model.mlp_only_layers, ModelConfig::sparse_layer): the family's SwiGLU MLP of
  // ffn_hidden_size, named as Llama's (mlp.gate_up_proj, mlp.down_proj).
  bool dense_layers = false;
};
LlamaFamily llama_family();

// The Llama model of a config's model keys; llama_family_spec: a family member's.
TransformerSpec llama_spec(const ModelConfig& m);
TransformerSpec llama_family_spec(const LlamaFamily& f, const ModelConfig& m);
// The registry entry of a family member whose spec is `spec`: its Hugging Face adapter (the
// functions below bound to f) and its validation.
struct ArchSpec;
ArchSpec llama_family_arch(const LlamaFamily& f,
                           std::function<TransformerSpec(const ModelConfig&)> spec);
// The registry entry of a family member whose spec is llama_family_spec(f, ·), with its tiny
// preset (configs/models/<tiny_preset>.json): Mixtral, Qwen3-MoE, Qwen2, Mistral.
ArchSpec llama_family_member(const LlamaFamily& f, const std::string& tiny_preset);

// Hugging Face LlamaForCausalLM tensors (model.embed_tokens.weight (V, C) unpadded, separate
// q/k/v/o and gate/up/down projections, lm_head.weight only when untied) from our full tensors,
// and the inverse, checked against the config (InputError naming `path` and the tensor).
FullTensors llama_to_hf(const ModelConfig& m, const FullTensors& ours);
FullTensors llama_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path);
// LlamaConfig's config.json for the model, and its check against a directory's config.json
// (InputError(path, key, both values)).
nlohmann::json llama_hf_config(const ModelConfig& m);
void llama_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path);
// The model keys of a LlamaConfig config.json.
ModelConfig llama_model_config_from_hf(const nlohmann::json& hf, const std::string& path);
// LlamaForCausalLM's state-dict order of the tensor names (how save_pretrained shards; the
// registry entry's HfAdapter::hf_order).
std::vector<std::string> llama_hf_order(const ModelConfig& m);
// The rotary inv_freq buffers of older files are not parameters (nullopt); other names as they
// are.
std::optional<std::string> llama_canonical_name(const std::string& name);

// The family's adapter (llama_* above are llama_family()'s): per-expert Hugging Face tensors
// <moe>.experts.<e>.<gate|up|down> ↔ our fused experts_gate_up / experts_down, QK-norm weights
// as they are; the config.json of f.hf_class, its check and its model keys.
FullTensors llama_family_to_hf(const LlamaFamily& f, const ModelConfig& m, const FullTensors& ours);
FullTensors llama_family_from_hf(const LlamaFamily& f, const ModelConfig& m, const FullTensors& hf,
                                 const std::string& path);
nlohmann::json llama_family_hf_config(const LlamaFamily& f, const ModelConfig& m);
void llama_family_check_hf_config(const LlamaFamily& f, const ModelConfig& m,
                                  const nlohmann::json& hf, const std::string& path);
ModelConfig llama_family_model_config_from_hf(const LlamaFamily& f, const nlohmann::json& hf,
                                              const std::string& path);
std::vector<std::string> llama_family_hf_order(const LlamaFamily& f, const ModelConfig& m);

// The registry entry (models/registry.h).
ArchSpec llama_arch();

}  // namespace strata
