// commands/export.h — `strata export`: a checkpoint's model as one Hugging Face safetensors file.
//
//   strata export --checkpoint DIR --out model.safetensors
//
// DIR is a checkpoint (…/iter_<N>) or a checkpoint.dir, whose newest valid checkpoint is used.
// The file holds the tensor names and layouts of the architecture's Hugging Face class (its
// adapter in models/registry.h; GPT: GPT2LMHeadModel, vocabulary without padding, Conv1D
// weights as (in, out), the head equal to the embedding when tied, as transformers saves it).
// Any layout the checkpoint was saved under gives the same file. model.init_from reads it back.
//
// Thread-safety: one call at a time.
#pragma once

#include <string>
#include <vector>

namespace strata {

// Runs the command on its arguments (those after "export"); returns the exit status. Throws
// InputError for bad arguments or an unusable checkpoint.
int cmd_export(const std::vector<std::string>& args);

// The work of the command: checkpoint (or checkpoint.dir) → HF safetensors file at `out`.
// Returns the checkpoint used.
std::string export_checkpoint(const std::string& checkpoint, const std::string& out);

}  // namespace strata
