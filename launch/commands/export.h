// commands/export.h — `strata export`: a checkpoint's model in Hugging Face's format.
//
//   strata export --checkpoint DIR --out PATH [--max-shard-size SIZE] [--dtype fp32|bf16]
//
// DIR is a checkpoint (…/iter_<N>) or a checkpoint.dir, whose newest valid checkpoint is used.
// PATH ending in .safetensors: one file of tensors. Any other PATH: a model directory as
// transformers' save_pretrained writes it, which from_pretrained loads as it is: config.json (the
// adapter's hf_config) and model.safetensors, or, past SIZE (default 5GB), numbered shards and
// model.safetensors.index.json (models/hf_checkpoint.h). The tensors have the names and layouts of
// the architecture's Hugging Face class (its adapter in models/registry.h; GPT: GPT2LMHeadModel,
// vocabulary without padding, Conv1D weights as (in, out), the head equal to the embedding when
// tied; Llama: LlamaForCausalLM, q/k/v and gate/up unfused; BERT: BertForPreTraining, q/k/v
// unfused, the tied decoder left out). fp32 by default; bf16 rounds to
// nearest even. Any layout the checkpoint was saved under gives the same files. model.init_from
// reads either form back.
//
// Thread-safety: one call at a time.
#pragma once

#include <string>
#include <vector>

#include "models/hf_checkpoint.h"

namespace strata {

// Runs the command on its arguments (those after "export"); returns the exit status. Throws
// InputError for bad arguments or an unusable checkpoint.
int cmd_export(const std::vector<std::string>& args);

// The work of the command: checkpoint (or checkpoint.dir) → HF safetensors file or directory at
// `out` (above). Returns the checkpoint used.
std::string export_checkpoint(const std::string& checkpoint, const std::string& out,
                              const HfWriteOptions& options = {});

}  // namespace strata
