// gpt.h — GPT-2 (the "gpt" architecture): a pre-norm transformer (models/transformer/) with
// LayerNorm, learned positions, a GELU MLP, biases everywhere, multi-head attention, GPT-2's
// residual init scaling and an LM head tied to the token table unless model.tie_embeddings is
// false. Parameter names are GPT-2's (Hugging Face's without the `transformer.` prefix): wte,
// wpe, h.{l}.ln_1, h.{l}.attn.c_attn (rows [q; k; v]), h.{l}.attn.c_proj, h.{l}.ln_2,
// h.{l}.mlp.c_fc, h.{l}.mlp.c_proj, ln_f, [lm_head].
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

// GPT-2 of a config's model keys.
TransformerSpec gpt_spec(const ModelConfig& m);

// Hugging Face GPT2LMHeadModel tensors (transformer.wte.weight (V, C) unpadded, Conv1D weights
// (in, out), lm_head.weight equal to wte) from our full tensors, and the inverse, checked
// against the config.
FullTensors gpt_to_hf(const ModelConfig& m, const FullTensors& ours);
FullTensors gpt_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path);
// GPT2Config's config.json for the model, and its check against a directory's config.json
// (InputError(path, key, both values) on a shape key, the activation or the LayerNorm eps).
nlohmann::json gpt_hf_config(const ModelConfig& m);
void gpt_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path);
// The model keys of a GPT2Config config.json.
ModelConfig gpt_model_config_from_hf(const nlohmann::json& hf, const std::string& path);
// GPT2LMHeadModel's state-dict order of the tensor names (how save_pretrained shards).
std::vector<std::string> gpt_hf_order(const ModelConfig& m);
// Both spellings of GPT-2's tensors (with and without "transformer."); its attention-mask
// buffers are not parameters (nullopt).
std::optional<std::string> gpt_canonical_name(const std::string& name);

// The registry entry (models/registry.h).
struct ArchSpec;
ArchSpec gpt_arch();

}  // namespace strata
