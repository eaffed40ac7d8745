// The "mixtral" entry of the model registry (models/registry.h): Mixtral as a transformer spec,
// Llama's with a mixture of experts for its MLP.
#include "models/llama/llama.h"
#include "models/mixtral/mixtral.h"
#include "models/registry.h"

namespace strata {

// MixtralForCausalLM's names of what differs from LlamaForCausalLM (models/llama/llama.h).
LlamaFamily mixtral_family() {
  LlamaFamily f;
  f.arch = "mixtral";
  f.model_type = "mixtral";
  f.hf_class = "MixtralForCausalLM";
  f.moe = "block_sparse_moe";
  f.experts = {"w1", "w3", "w2"};
  f.expert_order = {0, 2, 1};
  f.always_renormalise = true;
  f.sliding_window = true;
  return f;
}

ArchSpec mixtral_arch() {
  return llama_family_member(mixtral_family(), "mixtral-tiny");
}

}  // namespace strata
