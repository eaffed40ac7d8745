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

ArchSpec mistral_arch() {
  return llama_family_member(mistral_family(), "mistral-tiny");
}

}  // namespace strata
