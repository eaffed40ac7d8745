// Hugging Face BertForPreTraining ↔ our full tensors (registry.h's HfAdapter for "bert").
//
// Both sides store weights (out, in) as nn.Linear does; what differs is the prefix, fusion and
// padding:
//   ours                                       Hugging Face
//   embeddings.* (word_embeddings (Vp, C))     bert.embeddings.* (word_embeddings (V, C))
//   encoder.layer.{l}.attention.self.qkv.      bert.encoder.layer.{l}.attention.self.{query,key,
//     {weight (3C, C), bias (3C)}                value}.{weight, bias}, stacked as rows [q; k; v]
//   encoder.layer.{l}.* (the rest), pooler.*   bert.encoder.layer.{l}.*, bert.pooler.*
//   cls.predictions.bias (Vp, 1)               cls.predictions.bias (V)
//   cls.predictions.transform.*,               the same
//   cls.seq_relationship.*
//   (the word embeddings)                      cls.predictions.decoder.weight, .bias: tied to
//                                              the word embeddings and cls.predictions.bias;
//                                              save_pretrained writes one of each pair, a file
//                                              may carry both (they must then be equal)
// The position_ids buffer older files carry is not a parameter. A checkpoint with more positions
// than model.seq_len gives the first seq_len of them (fine-tuning at a shorter length).
//
// config.json is BertConfig's, with Strata's fixed choices spelled out (exact GELU "gelu",
// absolute positions, dropouts 0, tied decoder); a directory given to model.init_from must agree
// on them and on every key that fixes a tensor's shape (max_position_embeddings may be larger
// than model.seq_len).
#include <optional>
#include <string>

#include "models/bert/bert.h"
#include "models/hf_checkpoint.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

FullTensor stack_rows(std::initializer_list<const FullTensor*> parts) {
  FullTensor o;
  const FullTensor& first = **parts.begin();
  o.shape = first.shape;
  o.shape[0] = 0;
  for (const FullTensor* p : parts) {
    o.shape[0] += p->shape[0];
    o.data.insert(o.data.end(), p->data.begin(), p->data.end());
  }
  return o;
}

// Elements [begin, begin + count) of a 1-D tensor.
FullTensor hf_slice(const FullTensor& t, int64_t begin, int64_t count) {
  FullTensor o;
  o.shape = {count};
  o.data.assign(t.data.begin() + begin, t.data.begin() + begin + count);
  return o;
}

std::string layer(int64_t l) {
  return "encoder.layer." + std::to_string(l) + ".";
}

// The per-layer tensors both sides name alike (under bert.), with their shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> same_layer_tensors(const ModelConfig& m) {
  const int64_t C = m.hidden_size, F = m.ffn_hidden_size;
  return {{"attention.output.dense.weight", {C, C}},
          {"attention.output.dense.bias", {C}},
          {"attention.output.LayerNorm.weight", {C}},
          {"attention.output.LayerNorm.bias", {C}},
          {"intermediate.dense.weight", {F, C}},
          {"intermediate.dense.bias", {F}},
          {"output.dense.weight", {C, F}},
          {"output.dense.bias", {C}},
          {"output.LayerNorm.weight", {C}},
          {"output.LayerNorm.bias", {C}}};
}

// The tensors of the model both sides name alike outside the layers (ours, Hugging Face's name).
std::vector<std::pair<std::string, std::vector<int64_t>>> same_tensors(const ModelConfig& m) {
  const int64_t C = m.hidden_size;
  return {{"embeddings.token_type_embeddings.weight", {m.type_vocab_size, C}},
          {"embeddings.LayerNorm.weight", {C}},
          {"embeddings.LayerNorm.bias", {C}},
          {"pooler.dense.weight", {C, C}},
          {"pooler.dense.bias", {C}},
          {"cls.predictions.transform.dense.weight", {C, C}},
          {"cls.predictions.transform.dense.bias", {C}},
          {"cls.predictions.transform.LayerNorm.weight", {C}},
          {"cls.predictions.transform.LayerNorm.bias", {C}},
          {"cls.seq_relationship.weight", {2, C}},
          {"cls.seq_relationship.bias", {2}}};
}

// Hugging Face's name of one of ours: the BertModel's tensors under "bert.", the heads as they
// are.
std::string hf_name(const std::string& ours) {
  return ours.rfind("cls.", 0) == 0 ? ours : "bert." + ours;
}

}  // namespace

FullTensors bert_to_hf(const ModelConfig& m, const FullTensors& ours) {
  const auto get = [&](const std::string& n) -> const FullTensor& { return ours.at(n); };
  const int64_t C = m.hidden_size;
  FullTensors hf;
  hf["bert.embeddings.word_embeddings.weight"] =
      hf_rows(get("embeddings.word_embeddings.weight"), 0, m.vocab_size);
  hf["bert.embeddings.position_embeddings.weight"] = get("embeddings.position_embeddings.weight");
  for (const auto& [n, shape] : same_tensors(m)) hf[hf_name(n)] = get(n);
  hf["cls.predictions.bias"] = hf_rows(get("cls.predictions.bias"), 0, m.vocab_size);
  hf["cls.predictions.bias"].shape = {m.vocab_size};
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string o = layer(l), h = "bert." + o;
    const FullTensor& w = get(o + "attention.self.qkv.weight");
    const FullTensor& b = get(o + "attention.self.qkv.bias");
    const char* parts[] = {"query", "key", "value"};
    for (int64_t k = 0; k < 3; ++k) {
      hf[h + "attention.self." + parts[k] + ".weight"] = hf_rows(w, k * C, C);
      hf[h + "attention.self." + parts[k] + ".bias"] = hf_slice(b, k * C, C);
    }
    for (const auto& [n, shape] : same_layer_tensors(m)) hf[h + n] = get(o + n);
  }
  return hf;
}

FullTensors bert_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path) {
  const auto get = [&](const std::string& n,
                       const std::vector<int64_t>& shape) -> const FullTensor& {
    return hf_tensor(hf, n, shape, path);
  };
  const int64_t C = m.hidden_size;
  FullTensors o;
  const FullTensor& word = get("bert.embeddings.word_embeddings.weight", {m.vocab_size, C});
  o["embeddings.word_embeddings.weight"] = word;
  const auto pos = hf.find("bert.embeddings.position_embeddings.weight");
  const int64_t positions =
      pos != hf.end() && pos->second.shape.size() == 2 && pos->second.shape[0] > m.seq_len
          ? pos->second.shape[0]
          : m.seq_len;
  o["embeddings.position_embeddings.weight"] =
      hf_rows(get("bert.embeddings.position_embeddings.weight", {positions, C}), 0, m.seq_len);
  for (const auto& [n, shape] : same_tensors(m)) o[n] = get(hf_name(n), shape);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string p = layer(l), h = "bert." + p + "attention.self.";
    o[p + "attention.self.qkv.weight"] =
        stack_rows({&get(h + "query.weight", {C, C}), &get(h + "key.weight", {C, C}),
                    &get(h + "value.weight", {C, C})});
    o[p + "attention.self.qkv.bias"] = stack_rows(
        {&get(h + "query.bias", {C}), &get(h + "key.bias", {C}), &get(h + "value.bias", {C})});
    for (const auto& [n, shape] : same_layer_tensors(m)) o[p + n] = get("bert." + p + n, shape);
  }
  // The decoder's bias under either of its two names (equal when both are there); its weight,
  // when the file has it, must be the word embeddings.
  const bool bias = hf.count("cls.predictions.bias") > 0;
  const bool decoder_bias = hf.count("cls.predictions.decoder.bias") > 0;
  const FullTensor& b =
      get(bias || !decoder_bias ? "cls.predictions.bias" : "cls.predictions.decoder.bias",
          {m.vocab_size});
  if (bias && decoder_bias && get("cls.predictions.decoder.bias", {m.vocab_size}).data != b.data)
    throw InputError(path, "cls.predictions.decoder.bias",
                     "none, or one equal to cls.predictions.bias (they are one parameter of "
                     "BertForPreTraining); it differs");
  o["cls.predictions.bias"] = {{m.vocab_size, 1}, b.data};
  if (hf.count("cls.predictions.decoder.weight") &&
      get("cls.predictions.decoder.weight", {m.vocab_size, C}).data != word.data)
    throw InputError(path, "cls.predictions.decoder.weight",
                     "none, or one equal to bert.embeddings.word_embeddings.weight (Strata's BERT "
                     "ties its decoder to the word embeddings); it differs");
  return o;
}

std::optional<std::string> bert_canonical_name(const std::string& name) {
  if (name == "bert.embeddings.position_ids") return std::nullopt;  // a buffer, not a parameter
  return name;
}

std::vector<std::string> bert_hf_order(const ModelConfig& m) {
  std::vector<std::string> names = {
      "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
      "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
      "bert.embeddings.LayerNorm.bias"};
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string h = "bert." + layer(l);
    for (const char* part : {"query", "key", "value"})
      for (const char* what : {".weight", ".bias"})
        names.push_back(h + "attention.self." + part + what);
    for (const auto& [n, shape] : same_layer_tensors(m)) names.push_back(h + n);
  }
  for (const char* n :
       {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.predictions.bias",
        "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
        "cls.seq_relationship.weight", "cls.seq_relationship.bias"})
    names.push_back(n);
  return names;
}

nlohmann::json bert_hf_config(const ModelConfig& m) {
  return {{"architectures", {"BertForPreTraining"}},
          {"model_type", "bert"},
          {"hidden_size", m.hidden_size},
          {"num_hidden_layers", m.num_layers},
          {"num_attention_heads", m.num_heads},
          {"intermediate_size", m.ffn_hidden_size},
          {"max_position_embeddings", m.seq_len},
          {"vocab_size", m.vocab_size},
          {"type_vocab_size", m.type_vocab_size},
          {"layer_norm_eps", m.layer_norm_eps},
          {"hidden_act", "gelu"},
          {"position_embedding_type", "absolute"},
          {"hidden_dropout_prob", m.dropout},
          {"attention_probs_dropout_prob", m.dropout},
          {"initializer_range", m.init_std},
          {"tie_word_embeddings", true},
          {"dtype", "float32"},
          {"torch_dtype", "float32"}};
}

void bert_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path) {
  // Absent (or null) keys take BertConfig's defaults, as from_pretrained would.
  check_hf_key(hf, "model_type", "bert", "model.arch \"bert\"", path, "bert");
  check_hf_key(hf, "num_hidden_layers", m.num_layers, "model.num_layers", path, 12);
  check_hf_key(hf, "hidden_size", m.hidden_size, "model.hidden_size", path, 768);
  check_hf_key(hf, "num_attention_heads", m.num_heads, "model.num_heads", path, 12);
  check_hf_key(hf, "intermediate_size", m.ffn_hidden_size, "model.ffn_hidden_size", path, 3072);
  check_hf_key(hf, "vocab_size", m.vocab_size, "model.vocab_size", path, 30522);
  check_hf_key(hf, "type_vocab_size", m.type_vocab_size, "model.type_vocab_size", path, 2);
  check_hf_key(hf, "layer_norm_eps", m.layer_norm_eps, "model.layer_norm_eps", path, 1e-12);
  check_hf_key(hf, "hidden_act", "gelu", "Strata's BERT, exact GELU,", path, "gelu");
  check_hf_key(hf, "position_embedding_type", "absolute", "Strata's BERT, absolute positions,",
               path, "absolute");
  check_hf_key(hf, "tie_word_embeddings", true, "Strata's BERT, its decoder tied,", path, true);
  const int positions = hf_int(hf, "max_position_embeddings", 512, path);
  if (positions < m.seq_len)
    throw InputError(path, "max_position_embeddings",
                     "at least model.seq_len " + std::to_string(m.seq_len) + ", found " +
                         std::to_string(positions));
}

ModelConfig bert_model_config_from_hf(const nlohmann::json& hf, const std::string& path) {
  ModelConfig m;
  m.arch = "bert";
  m.preset = "";
  m.num_layers = hf_int(hf, "num_hidden_layers", 12, path);
  m.hidden_size = hf_int(hf, "hidden_size", 768, path);
  m.num_heads = hf_int(hf, "num_attention_heads", 12, path);
  m.ffn_hidden_size = hf_int(hf, "intermediate_size", 3072, path);
  m.seq_len = hf_int(hf, "max_position_embeddings", 512, path);
  m.vocab_size = hf_int(hf, "vocab_size", 30522, path);
  m.type_vocab_size = hf_int(hf, "type_vocab_size", 2, path);
  m.layer_norm_eps = hf_number(hf, "layer_norm_eps", 1e-12, path);
  m.init_std = hf_number(hf, "initializer_range", 0.02, path);
  m.tie_embeddings = true;
  bert_check_hf_config(m, hf, path);
  return m;
}

}  // namespace strata
