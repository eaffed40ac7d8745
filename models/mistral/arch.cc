// The "mistral" entry of the model registry (models/registry.h): Llama's transformer spec under
// MistralForCausalLM's names.
#include "models/llama/llama.h"
#include "models/mistral/mistral.h"
#include "models/registry.h"

namespace strata {

LlamaFamily mistral_family() {
  LlamaFamily f;
  f.arch = "mistral";
  f.model_type = "mistral";
  f.hf_class = "MistralForCausalLM";
  f.sliding_window = true;
  return f;
}

TransformerSpec mistral_spec(const ModelConfig& m) {
  return llama_family_spec(mistral_family(), m);
}

ArchSpec mistral_arch() {
  ArchSpec a = llama_family_arch(mistral_family(), mistral_spec);
  a.tiny_preset = "mistral-tiny";
  return a;
}

}  // namespace strata
