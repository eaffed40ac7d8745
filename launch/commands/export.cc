#include "launch/commands/export.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "launch/config/config_parse.h"
#include "launch/train/model_state.h"
#include "models/registry.h"
#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/tokenizer.h"
#include "runtime/io/input_file.h"

namespace strata {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string export_checkpoint(const std::string& checkpoint, const std::string& out,
                              const HfWriteOptions& options) {
  const std::string path = checkpoint_or_newest(checkpoint, std::cerr);
  ModelConfig mc;
  FullTensors hf;
  std::optional<std::string> tok;  // the run's tokenizer, checked with the rest
  {
    LoadedCheckpoint c = read_checkpoint(path);  // checked as it is read (InputError)
    tok = c.tokenizer;
    // Only the parameters are exported: the optimizer moments (2× the model) go first.
    for (RankShard& s : c.shards)
      s.pieces.erase(std::remove_if(s.pieces.begin(), s.pieces.end(),
                                    [](const ShardPiece& p) { return p.kind != "param"; }),
                     s.pieces.end());
    // The model keys the checkpoint recorded (model_shape_json: the architecture and the keys
    // that fix parameter shapes), read as a config's model section. The data section only
    // matters to training: the smallest synthetic vocabulary keeps its check out of the way.
    mc = config_from_json(nlohmann::json{{"model", c.run_state.at("model")}},
                          path + "/run_state.json", {"data.synthetic.vocab_size=1"})
             .model;
    if (!architecture(mc.arch).hf.to_hf)
      throw InputError(
          path, "model.arch",
          "an architecture with a Hugging Face adapter: \"" + mc.arch + "\" has none yet");
    const FullTensors ours = assemble_full(c.shards, "param", {}, path);
    c.shards.clear();
    hf = architecture(mc.arch).hf.to_hf(mc, ours);
  }
  if (ends_with(out, ".safetensors")) {
    write_hf_file(out, hf, options.dtype);
    return path;
  }
  const HfAdapter& adapter = architecture(mc.arch).hf;
  if (!adapter.hf_config)
    throw InputError(out, "",
                     "a path ending in .safetensors: architecture \"" + mc.arch +
                         "\" has no Hugging Face config.json writer");
  nlohmann::json config = adapter.hf_config(mc);
  // "dtype" since transformers 4.56, "torch_dtype" before.
  config["dtype"] = config["torch_dtype"] = options.dtype == "BF16" ? "bfloat16" : "float32";
  // The run's tokenizer goes with the model as the tokenizer.json transformers reads: a
  // tiktoken ranks file converted (Tokenizer::hf_tokenizer_json, its pattern from its rank
  // count, as training read it).
  std::map<std::string, std::string> files;
  if (tok)
    files["tokenizer.json"] = is_tokenizer_json(*tok)
                                  ? read_input_file(*tok, kMaxTokenizerFileBytes)
                                  : Tokenizer::load(*tok)->hf_tokenizer_json();
  write_hf_directory(out, config, hf, options,
                     adapter.hf_order ? adapter.hf_order(mc) : std::vector<std::string>{}, files);
  if (tok)
    std::printf("tokenizer: %s/tokenizer.json (%s)\n", out.c_str(),
                is_tokenizer_json(*tok) ? "the run's data.tokenizer"
                                        : "the run's tiktoken file, converted");
  return path;
}

int cmd_export(const std::vector<std::string>& args) {
  std::string ckpt, out;
  HfWriteOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: strata export --checkpoint DIR --out PATH [--max-shard-size SIZE]\n"
          "                     [--dtype fp32|bf16]\n"
          "  Writes the checkpoint's model with its Hugging Face class's names and layouts\n"
          "  (GPT: GPT2LMHeadModel; Llama: LlamaForCausalLM; Qwen2: Qwen2ForCausalLM; Mistral:\n"
          "  MistralForCausalLM; BERT: BertForPreTraining; Mixtral: MixtralForCausalLM;\n"
          "  Qwen3-MoE: Qwen3MoeForCausalLM).\n"
          "  DIR:  a checkpoint (iter_<N>) or a checkpoint.dir (its newest valid checkpoint).\n"
          "  PATH: ending in .safetensors, one file of tensors; otherwise a directory that\n"
          "        transformers' from_pretrained loads: config.json and model.safetensors, or\n"
          "        model-0000k-of-0000n.safetensors shards and model.safetensors.index.json;\n"
          "        and tokenizer.json when the run trained with a tokenizer (data.tokenizer;\n"
          "        a tiktoken file is converted, as strata data convert does).\n"
          "  --max-shard-size SIZE  largest shard of a directory (default 5GB; 500MB, 2GiB,\n"
          "                         or bytes); a tensor is never split across shards.\n"
          "  --dtype fp32|bf16      the tensors' type (default fp32; bf16 rounds to nearest\n"
          "                         even).\n");
      return 0;
    }
    const bool has_value = i + 1 < args.size();
    if ((a == "--checkpoint" || a == "--out") && has_value) {
      (a == "--out" ? out : ckpt) = args[++i];
      continue;
    }
    if (a == "--max-shard-size" && has_value) {
      const std::optional<int64_t> size = parse_hf_size(args[++i]);
      if (!size)
        throw InputError(
            "<command line>", "--max-shard-size",
            "a size such as 5GB, 500MB, 2GiB or a byte count ≥ 1, got \"" + args[i] + "\"");
      options.max_shard_bytes = *size;
      continue;
    }
    if (a == "--dtype" && has_value) {
      const std::string d = args[++i];
      if (d != "fp32" && d != "bf16")
        throw InputError("<command line>", "--dtype", "fp32 or bf16, got \"" + d + "\"");
      options.dtype = d == "bf16" ? "BF16" : "F32";
      continue;
    }
    throw InputError("<command line>", a,
                     "--checkpoint DIR --out PATH [--max-shard-size SIZE] [--dtype fp32|bf16] "
                     "(see strata export --help)");
  }
  if (ckpt.empty()) throw InputError("<command line>", "--checkpoint", "a checkpoint directory");
  if (out.empty())
    throw InputError("<command line>", "--out", "an output file (.safetensors) or directory");
  const std::string used = export_checkpoint(ckpt, out, options);
  std::printf("exported %s to %s\n", used.c_str(), out.c_str());
  return 0;
}

}  // namespace strata
