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

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/layers/params.h"
#include "models/transformer/transformer.h"
#include "runtime/base/config.h"

namespace strata {

// The Llama model of a config's model keys.
TransformerSpec llama_spec(const ModelConfig& m);

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

// The registry entry (models/registry.h).
struct ArchSpec;
ArchSpec llama_arch();

}  // namespace strata
