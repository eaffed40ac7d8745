// Hugging Face GPT2LMHeadModel ↔ our full tensors (registry.h's HfAdapter for "gpt").
//
// HF's Conv1D stores (in, out) where ours is (out, in); transformer.wte.weight is (V, C)
// without the padded rows; lm_head.weight equals wte when the embeddings are tied, as
// transformers saves it.
//
// config.json: GPT2Config with Strata's fixed choices spelled out (tanh GELU as "gelu_new",
// LayerNorm eps 1e-5, dropouts 0); a directory given to model.init_from must agree on them and on
// every key that fixes a tensor's shape.
#include <optional>
#include <string>

#include "models/gpt/gpt.h"
#include "models/hf_checkpoint.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

FullTensor transpose(const FullTensor& t) {
  FullTensor o;
  const int64_t r = t.shape[0], c = t.shape[1];
  o.shape = {c, r};
  o.data.resize(t.data.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      o.data[static_cast<size_t>(j * r + i)] = t.data[static_cast<size_t>(i * c + j)];
  return o;
}

}  // namespace

FullTensors gpt_to_hf(const ModelConfig& m, const FullTensors& ours) {
  FullTensors hf;
  const auto get = [&](const std::string& n) -> const FullTensor& { return ours.at(n); };
  hf["transformer.wte.weight"] = hf_rows(get("wte"), 0, m.vocab_size);
  hf["transformer.wpe.weight"] = get("wpe");
  for (int l = 0; l < m.num_layers; ++l) {
    const std::string o = "h." + std::to_string(l) + ".", h = "transformer." + o;
    for (const char* n :
         {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias",
          "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"})
      hf[h + n] = get(o + n);
    for (const char* n :
         {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
      hf[h + n] = transpose(get(o + n));
  }
  hf["transformer.ln_f.weight"] = get("ln_f.weight");
  hf["transformer.ln_f.bias"] = get("ln_f.bias");
  hf["lm_head.weight"] = m.tie_embeddings ? hf["transformer.wte.weight"]
                                          : hf_rows(get("lm_head.weight"), 0, m.vocab_size);
  return hf;
}

FullTensors gpt_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path) {
  const auto get = [&](const std::string& n,
                       const std::vector<int64_t>& shape) -> const FullTensor& {
    return hf_tensor(hf, n, shape, path);
  };
  const int64_t C = m.hidden_size, F = m.ffn_hidden_size;
  FullTensors o;
  o["wte"] = get("transformer.wte.weight", {m.vocab_size, C});
  // A checkpoint with more positions than model.seq_len (fine-tuning at a shorter context):
  // the first seq_len of them.
  const auto wpe = hf.find("transformer.wpe.weight");
  const int64_t positions =
      wpe != hf.end() && wpe->second.shape.size() == 2 && wpe->second.shape[0] > m.seq_len
          ? wpe->second.shape[0]
          : m.seq_len;
  o["wpe"] = hf_rows(get("transformer.wpe.weight", {positions, C}), 0, m.seq_len);
  for (int l = 0; l < m.num_layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".", h = "transformer." + p;
    for (const char* n : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
                          "attn.c_proj.bias", "mlp.c_proj.bias"})
      o[p + n] = get(h + n, {C});
    o[p + "attn.c_attn.bias"] = get(h + "attn.c_attn.bias", {3 * C});
    o[p + "mlp.c_fc.bias"] = get(h + "mlp.c_fc.bias", {F});
    o[p + "attn.c_attn.weight"] = transpose(get(h + "attn.c_attn.weight", {C, 3 * C}));
    o[p + "attn.c_proj.weight"] = transpose(get(h + "attn.c_proj.weight", {C, C}));
    o[p + "mlp.c_fc.weight"] = transpose(get(h + "mlp.c_fc.weight", {C, F}));
    o[p + "mlp.c_proj.weight"] = transpose(get(h + "mlp.c_proj.weight", {F, C}));
  }
  o["ln_f.weight"] = get("transformer.ln_f.weight", {C});
  o["ln_f.bias"] = get("transformer.ln_f.bias", {C});
  if (!m.tie_embeddings) {
    o["lm_head.weight"] = get("lm_head.weight", {m.vocab_size, C});
  } else if (hf.count("lm_head.weight") &&
             get("lm_head.weight", {m.vocab_size, C}).data != o["wte"].data) {
    throw InputError(path, "lm_head.weight",
                     "none, or one equal to transformer.wte.weight (model.tie_embeddings is "
                     "true); it differs: an untied model needs model.tie_embeddings false");
  }
  return o;
}

std::optional<std::string> gpt_canonical_name(const std::string& name) {
  const auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  // The causal-mask buffers of older GPT2LMHeadModel files are not parameters.
  if (ends(".attn.bias") || ends(".attn.masked_bias")) return std::nullopt;
  // GPT-2's own published files name the GPT2Model's tensors without "transformer.".
  if (name.rfind("transformer.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
  return "transformer." + name;
}

nlohmann::json gpt_hf_config(const ModelConfig& m) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_layer", m.num_layers},
          {"n_embd", m.hidden_size},
          {"n_head", m.num_heads},
          {"n_inner", m.ffn_hidden_size},
          {"n_positions", m.seq_len},
          {"vocab_size", m.vocab_size},
          {"tie_word_embeddings", m.tie_embeddings},
          {"layer_norm_epsilon", 1e-5},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", m.dropout},
          {"embd_pdrop", m.dropout},
          {"attn_pdrop", m.dropout},
          {"initializer_range", m.init_std},
          // GPT-2's end of text is its last token (50256); a smaller vocabulary keeps it in range.
          {"bos_token_id", m.vocab_size - 1},
          {"eos_token_id", m.vocab_size - 1},
          {"dtype", "float32"},
          {"torch_dtype", "float32"}};
}

std::vector<std::string> gpt_hf_order(const ModelConfig& m) {
  std::vector<std::string> names = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int l = 0; l < m.num_layers; ++l)
    for (const char* n :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      names.push_back("transformer.h." + std::to_string(l) + "." + n);
  for (const char* n : {"transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"})
    names.push_back(n);
  return names;
}

void gpt_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path) {
  // Absent keys take GPT2Config's defaults, as from_pretrained would.
  check_hf_key(hf, "model_type", "gpt2", "model.arch \"gpt\"", path, "gpt2");
  check_hf_key(hf, "n_layer", m.num_layers, "model.num_layers", path, 12);
  check_hf_key(hf, "n_embd", m.hidden_size, "model.hidden_size", path, 768);
  check_hf_key(hf, "n_head", m.num_heads, "model.num_heads", path, 12);
  // n_inner null means 4·n_embd.
  check_hf_key(hf, "n_inner", m.ffn_hidden_size, "model.ffn_hidden_size", path,
               4 * int64_t{hf_int(hf, "n_embd", 768, path)});
  // More positions than model.seq_len are fine (from_hf takes the first seq_len); fewer are not.
  const int64_t positions = hf_int(hf, "n_positions", 1024, path);
  if (positions < m.seq_len)
    throw InputError(path, "n_positions",
                     "at least model.seq_len " + std::to_string(m.seq_len) + ", found " +
                         std::to_string(positions));
  check_hf_key(hf, "vocab_size", m.vocab_size, "model.vocab_size", path, 50257);
  check_hf_key(hf, "tie_word_embeddings", m.tie_embeddings, "model.tie_embeddings", path, true);
  check_hf_key(hf, "layer_norm_epsilon", 1e-5, "Strata's GPT LayerNorm", path, 1e-5);
  const nlohmann::json act = hf_value(hf, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw InputError(path, "activation_function",
                     "\"gelu_new\" or \"gelu_pytorch_tanh\" (Strata's GPT uses the tanh GELU), "
                     "found " +
                         act.dump());
}

ModelConfig gpt_model_config_from_hf(const nlohmann::json& hf, const std::string& path) {
  ModelConfig m;
  m.arch = "gpt";
  m.preset = "";
  m.num_layers = hf_int(hf, "n_layer", 12, path);
  m.hidden_size = hf_int(hf, "n_embd", 768, path);
  m.num_heads = hf_int(hf, "n_head", 12, path);
  m.ffn_hidden_size = hf_int(hf, "n_inner", 4 * int64_t{m.hidden_size}, path);
  m.seq_len = hf_int(hf, "n_positions", 1024, path);
  m.vocab_size = hf_int(hf, "vocab_size", 50257, path);
  m.tie_embeddings = hf_bool(hf, "tie_word_embeddings", true, path);
  m.init_std = hf_number(hf, "initializer_range", 0.02, path);
  gpt_check_hf_config(m, hf, path);  // what Strata's GPT does not do (another activation, …)
  return m;
}

}  // namespace strata
