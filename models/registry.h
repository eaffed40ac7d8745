// registry.h — model.arch → how to describe, build and convert that architecture.
//
// Each architecture folder (models/gpt/, …) provides one ArchSpec; models/registry.cc lists
// them. Everything outside models/ reaches an architecture only through these entries: the
// trainer builds its Model, the planner and the dry run read its ModelDescription, `strata
// export` and model.init_from go through its Hugging Face adapter.
//
// Thread-safety: the registry is built once on first use and read-only afterwards.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/description.h"
#include "models/model.h"
#include "models/transformer/transformer.h"
#include "runtime/base/config.h"

namespace strata {

// Between our full tensors (models/layers/params.h: our names and layouts, the vocabulary padded
// as stored) and a Hugging Face checkpoint's state dict for this architecture.
struct HfAdapter {
  // The HF transformers class the tensors are named after ("GPT2LMHeadModel").
  std::string hf_class;
  // Our full tensors → HF tensors (names, layouts, vocabulary without padding).
  std::function<FullTensors(const ModelConfig& m, const FullTensors& ours)> to_hf;
  // HF tensors → our full tensors, checked against the config: InputError naming `path` and the
  // tensor when one is missing or has another shape.
  std::function<FullTensors(const ModelConfig& m, const FullTensors& hf, const std::string& path)>
      from_hf;
  // The config.json transformers' from_pretrained reads for this model (an export writes it).
  std::function<nlohmann::json(const ModelConfig& m)> hf_config;
  // Refuses, with InputError(path, key, …), a Hugging Face config.json whose shape keys differ
  // from the model config (a directory given to model.init_from).
  std::function<void(const ModelConfig& m, const nlohmann::json& hf, const std::string& path)>
      check_hf_config;
  // The HF class's state-dict order of its tensor names (the order save_pretrained assigns
  // tensors to shards in, so an export shards exactly as transformers would). Optional: without
  // it, hf_tensor_order's (models/hf_checkpoint.h).
  std::function<std::vector<std::string>(const ModelConfig& m)> hf_order = {};
  // The model keys of a Hugging Face config.json of this class (its model_type: "gpt2",
  // "llama"), checked by check_hf_config: what `strata generate --hf DIR` builds.
  std::string hf_model_type = {};
  std::function<ModelConfig(const nlohmann::json& hf, const std::string& path)> model_config = {};
  // A file's tensor name in the spelling from_hf reads (GPT-2's published files drop the
  // "transformer." prefix), or nullopt for a tensor that is not a parameter (a causal-mask or
  // rotary buffer some files carry). Optional: names as they are.
  std::function<std::optional<std::string>(const std::string& name)> canonical_name = {};
};

struct ArchSpec {
  std::string name;  // model.arch
  // The model of a config's keys: its embedding, block and head as a TransformerSpec
  // (models/transformer/transformer.h), which is built, laid out and described.
  std::function<TransformerSpec(const ModelConfig&)> spec;
  HfAdapter hf;
  // Refuses, with InputError(file, key, …), a config this architecture cannot build under a
  // tensor-parallel size t (sizes that do not divide, keys it does not support).
  std::function<void(const ModelConfig&, int tensor, const std::string& file)> validate;
  // Its data is masked-LM samples (an encoder: sentence pairs, token types, padding, masked
  // positions; runtime/data/data_source.h's SamplingShape::masked_lm) instead of next-token
  // sequences.
  bool masked_lm = false;
  // Its smallest preset (configs/models/): what the layout tests (STRATA_TEST_ARCH) train.
  std::string tiny_preset;
  // It takes model.num_key_value_heads (grouped-query attention).
  bool grouped_query = false;
};

// Every registered architecture, in registration order.
const std::vector<ArchSpec>& architectures();
// The names model.arch accepts.
std::vector<std::string> architecture_names();
// The entry of m.arch (std::invalid_argument when none: the config parser refuses unknown
// names first).
const ArchSpec& architecture(const std::string& name);

// Shorthands over architecture(m.arch).
TransformerSpec model_spec(const ModelConfig& m);
std::unique_ptr<ModelDescription> describe_model(const ModelConfig& m);
std::unique_ptr<Model> build_model(const ModelConfig& m, const ModelOptions& o, Backend& backend);
// The parameters a rank holds at tensor (size, rank) and expert (size, rank).
ParamLayout model_layout(const ModelConfig& m, int tensor, int tensor_rank, bool sp,
                         const std::vector<ModelPiece>& pieces, int expert = 1,
                         int expert_rank = 0);
// For a decoder's validate: BERT's keys (model.type_vocab_size, model.layer_norm_eps) would be
// ignored, so a value other than their default is refused (InputError naming the key).
void refuse_encoder_keys(const ModelConfig& m, const std::string& file);
// For a dense architecture's validate: the mixture-of-experts keys (model.num_experts, …,
// model.head_dim, model.decoder_sparse_step, model.mlp_only_layers) would be ignored, so a value
// other than their default is refused.
void refuse_moe_keys(const ModelConfig& m, const std::string& file);
// For an architecture without Qwen3-MoE's dense layers (every one but qwen3_moe): a
// model.decoder_sparse_step or model.mlp_only_layers other than the default is refused.
void refuse_dense_layer_keys(const ModelConfig& m, const std::string& file);
// For a mixture of experts' validate (mixtral, qwen3_moe): at least one expert, 1 ≤
// num_experts_per_tok ≤ num_experts, an expert width and a head count the tensor group t
// divides, an even head size (rotary embeddings), at least one sparse layer; the encoder's keys
// refused.
void validate_moe(const ModelConfig& m, int tensor, const std::string& file);

// The model keys of a Hugging Face directory's config.json, by its model_type (InputError naming
// config.json when no architecture has that class).
ModelConfig model_config_from_hf(const nlohmann::json& hf, const std::string& path);

}  // namespace strata
