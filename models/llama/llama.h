// llama.h — the Llama decoder (model.arch "llama").
//
// Hugging Face interop (models/llama/hf_llama.cc): LlamaForCausalLM's state dict and config.json
// ↔ our full tensors and model config.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/layers/params.h"
#include "runtime/config.h"

namespace strata {

// Hugging Face LlamaForCausalLM tensors (model.embed_tokens.weight (V, C) unpadded, separate
// q/k/v/o and gate/up/down projections, lm_head.weight only when untied) from our full tensors,
// and the inverse, checked against the config (InputError naming `path` and the tensor).
FullTensors llama_to_hf(const ModelConfig& m, const FullTensors& ours);
FullTensors llama_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path);
// LlamaConfig's config.json for the model, and its check against a directory's config.json
// (InputError(path, key, both values)).
nlohmann::json llama_hf_config(const ModelConfig& m);
void llama_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path);
// LlamaForCausalLM's state-dict order of the tensor names (how save_pretrained shards; the
// registry entry's HfAdapter::hf_order).
std::vector<std::string> llama_hf_order(const ModelConfig& m);

}  // namespace strata
