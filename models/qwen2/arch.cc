// The "qwen2" entry of the model registry (models/registry.h): Qwen2 as a transformer spec,
// Llama's with biases on q, k and v.
#include "models/llama/llama.h"
#include "models/qwen2/qwen2.h"
#include "models/registry.h"

namespace strata {

// Qwen2ForCausalLM's names of what differs from LlamaForCausalLM (models/llama/llama.h).
LlamaFamily qwen2_family() {
  LlamaFamily f;
  f.arch = "qwen2";
  f.model_type = "qwen2";
  f.hf_class = "Qwen2ForCausalLM";
  f.qkv_bias = true;
  return f;
}

ArchSpec qwen2_arch() {
  return llama_family_member(qwen2_family(), "qwen2-tiny");
}

}  // namespace strata
