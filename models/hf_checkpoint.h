// hf_checkpoint.h — Hugging Face checkpoints on disk, read and written for model.init_from and
// `strata export`.
//
// Two forms:
//  - a model directory as transformers' save_pretrained writes it: config.json and either one
//    model.safetensors or shards model-0000k-of-0000n.safetensors listed in
//    model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {tensor:
//    shard}});
//  - a single .safetensors file (tensors only, no config).
// Tensors are named and laid out as the architecture's Hugging Face class has them; the
// architecture's adapter (models/registry.h) converts between those and our full tensors.
//
// Reading: F32, BF16 and F16 tensors read as f32 exactly (F64 rounds); tensors of other dtypes
// (integer buffers, a fixture's token ids) are not parameters and are skipped. Files are read one
// tensor at a time, so the host holds the checkpoint once as f32 (plus one tensor's raw bytes).
// Every tensor a directory's weight map lists must be in its shard: a missing shard or tensor is
// an InputError naming the file and the tensor.
//
// Writing follows save_pretrained: tensors in the HF class's state-dict order (the adapter's
// hf_order, else hf_tensor_order), assigned to shards in that order and never split
// (huggingface_hub's split_torch_state_dict_into_shards: a shard is closed when the next tensor
// would take it past the maximum; a tensor larger than the maximum gets a shard of its own), one
// shard → model.safetensors without an index, otherwise the numbered shards and the index
// ({"metadata": {"total_parameters", "total_size"}, "weight_map"}: 2-space indented JSON, keys
// sorted). Files of an earlier save in the directory that the new one does not write
// (model.safetensors, the index, numbered shards) are removed, so a reader never mixes two saves.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/layers/params.h"
#include "runtime/base/config.h"

namespace strata {

// The float tensors of a checkpoint, by Hugging Face name, and the file each came from.
struct HfTensors {
  FullTensors tensors;                      // [HF tensor name] f32
  std::map<std::string, std::string> file;  // [HF tensor name] the file it was read from
  std::string listing;  // the file that lists the tensors (the index, or the one safetensors file)
};

// Whether `path` is a Hugging Face model directory (else it is read as one safetensors file).
bool is_hf_directory(const std::string& path);
// A directory's config.json (InputError naming it when absent or not a JSON object).
nlohmann::json read_hf_config(const std::string& dir);
// The tensors of a directory or of one safetensors file (above).
HfTensors read_hf_tensors(const std::string& path);
// Their shapes alone, from the files' headers (no tensor bytes read): to check a config against
// the weights before anything of its size is built.
struct HfShapes {
  std::map<std::string, std::vector<int64_t>> shapes;  // [HF tensor name]
  std::map<std::string, std::string> file;             // [HF tensor name] the file holding it
  std::string listing;
};
HfShapes read_hf_shapes(const std::string& path);

// Our full tensors of model `m` from the checkpoint at `path` (model.init_from): for a directory,
// config.json is checked first by the adapter's check_hf_config (a mismatch names config.json,
// the key and both values), then the tensors are read and converted by its from_hf (a tensor
// missing or of another shape names the file it is in, or should be in, and the tensor).
FullTensors load_hf_model(const ModelConfig& m, const std::string& path);

// For the adapters' from_hf and to_hf: the tensor `name` of `hf`, which must have `shape`
// (InputError naming `path` and the tensor otherwise), and rows [begin, begin + count) of a 2-D
// tensor (a block of a fused weight, the vocabulary without its padding).
const FullTensor& hf_tensor(const FullTensors& hf, const std::string& name,
                            const std::vector<int64_t>& shape, const std::string& path);
FullTensor hf_rows(const FullTensor& t, int64_t begin, int64_t count);

// For the adapters' check_hf_config. hf_value: config.json's `key`, or `absent` (the value
// transformers assumes) when the key is missing or null. check_hf_key: that value must equal
// `want`, the model config's value of `ours` ("model.num_layers"), else InputError(path, key,
// "<want> (<ours> of the model config), found <got>"); numbers compare within 1e-9 relative.
nlohmann::json hf_value(const nlohmann::json& hf, const std::string& key,
                        const nlohmann::json& absent);
void check_hf_key(const nlohmann::json& hf, const std::string& key, const nlohmann::json& want,
                  const std::string& ours, const std::string& path, const nlohmann::json& absent);

// For the adapters' model_config: hf_value(hf, key, absent) read as an integer in [min, 2^31),
// a finite number or a boolean; InputError(path, key, "<what>, found <value>") when it is not
// one (a config.json is input: "n_embd": "64" must not end the run with a type_error).
int hf_int(const nlohmann::json& hf, const std::string& key, int64_t absent,
           const std::string& path, int64_t min = 1);
double hf_number(const nlohmann::json& hf, const std::string& key, double absent,
                 const std::string& path);
bool hf_bool(const nlohmann::json& hf, const std::string& key, bool absent,
             const std::string& path);

// What to write.
struct HfWriteOptions {
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default max_shard_size, "5GB"
  std::string dtype = "F32";                // "F32" or "BF16" (round to nearest even)
};

// A size as transformers' max_shard_size spells it: a byte count, or a number with KB, MB, GB,
// TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive ("5GB", "500MB",
// "1.5GiB"). Nothing for anything else or a size below one byte.
std::optional<int64_t> parse_hf_size(const std::string& s);

// A default order for shards: by name, numbers compared as numbers (layers.2 before
// layers.10), lm_head.* last (transformers' *ForCausalLM registers the head after the body).
std::vector<std::string> hf_tensor_order(const FullTensors& tensors);

// The shards of tensors (name, bytes) taken in order: lists of names (huggingface_hub's rule,
// above). Zero tensors give one empty shard.
std::vector<std::vector<std::string>> hf_shard_plan(
    const std::vector<std::pair<std::string, int64_t>>& sizes, int64_t max_shard_bytes);

// Writes `tensors` (HF names) with `config` as config.json into the directory `dir` (created
// when missing). `order`: the order tensors are assigned to shards in (the adapter's hf_order;
// names it lacks follow in hf_tensor_order, names without a tensor are skipped); within a file
// tensors are in name order, as the safetensors library writes them. `other_files`: files
// written beside config.json, name -> contents (tokenizer.json). InputError naming the path
// when something cannot be written.
void write_hf_directory(const std::string& dir, const nlohmann::json& config,
                        const FullTensors& tensors, const HfWriteOptions& options,
                        const std::vector<std::string>& order = {},
                        const std::map<std::string, std::string>& other_files = {});
// Writes `tensors` (HF names) as one safetensors file, metadata {"format": "pt"} as
// save_pretrained writes it. dtype: "F32" or "BF16".
void write_hf_file(const std::string& path, const FullTensors& tensors, const std::string& dtype);

}  // namespace strata
