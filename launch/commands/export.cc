#include "launch/commands/export.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include "launch/config/config_parse.h"
#include "launch/train/model_state.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace strata {

std::string export_checkpoint(const std::string& checkpoint, const std::string& out) {
  // A checkpoint itself has metadata.json; anything else is a checkpoint.dir to search.
  std::string path = checkpoint;
  if (!std::filesystem::exists(checkpoint + "/metadata.json")) {
    const auto sel = select_checkpoint(checkpoint, "auto", std::cerr);
    if (!sel) throw InputError(checkpoint, "", "a checkpoint or a directory holding a valid one");
    path = *sel;
  } else if (const std::string why = verify_checkpoint(path); !why.empty()) {
    throw InputError(path, "", "a complete checkpoint: " + why);
  }
  const LoadedCheckpoint c = read_checkpoint(path);
  // The model keys the checkpoint recorded (model_shape_json: the architecture and the keys
  // that fix parameter shapes), read as a config's model section. The data section only matters
  // to training: the smallest synthetic vocabulary keeps its check out of the way.
  const ModelConfig mc = config_from_json(nlohmann::json{{"model", c.run_state.at("model")}},
                                          path + "/run_state.json",
                                          {"data.synthetic.vocab_size=1"})
                             .model;
  const FullTensors hf =
      architecture(mc.arch).hf.to_hf(mc, assemble_full(c.shards, "param", {}, path));
  StFile f;
  f.metadata["format"] = "pt";  // what transformers' save_pretrained writes
  for (const auto& [name, t] : hf) f.tensors[name] = st_from_f32(t.data.data(), t.shape);
  write_safetensors(out, f);
  return path;
}

int cmd_export(const std::vector<std::string>& args) {
  std::string ckpt, out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: strata export --checkpoint DIR --out model.safetensors\n"
          "  Writes the checkpoint's model with its Hugging Face class's names and layouts\n"
          "  (GPT: GPT2LMHeadModel).\n"
          "  DIR: a checkpoint (iter_<N>) or a checkpoint.dir (its newest valid checkpoint).\n");
      return 0;
    }
    if ((a == "--checkpoint" || a == "--out") && i + 1 < args.size()) {
      (a == "--out" ? out : ckpt) = args[++i];
      continue;
    }
    throw InputError("<command line>", a, "--checkpoint DIR --out FILE (see strata export --help)");
  }
  if (ckpt.empty()) throw InputError("<command line>", "--checkpoint", "a checkpoint directory");
  if (out.empty()) throw InputError("<command line>", "--out", "an output file");
  const std::string used = export_checkpoint(ckpt, out);
  std::printf("exported %s to %s\n", used.c_str(), out.c_str());
  return 0;
}

}  // namespace strata
