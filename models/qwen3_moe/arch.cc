// The "qwen3_moe" entry of the model registry (models/registry.h): Qwen3-MoE as a transformer
// spec, Llama's with QK-norm and a mixture of experts for its MLP.
#include "models/llama/llama.h"
#include "models/qwen3_moe/qwen3_moe.h"
#include "models/registry.h"

namespace strata {

// Qwen3MoeForCausalLM's names of what differs from LlamaForCausalLM (models/llama/llama.h).
LlamaFamily qwen3_moe_family() {
  LlamaFamily f;
  f.arch = "qwen3_moe";
  f.model_type = "qwen3_moe";
  f.hf_class = "Qwen3MoeForCausalLM";
  f.qk_norm = true;
  f.moe = "mlp";
  f.experts = {"gate_proj", "up_proj", "down_proj"};
  f.dense_layers = true;
  return f;
}

ArchSpec qwen3_moe_arch() {
  return llama_family_member(qwen3_moe_family(), "qwen3-moe-tiny");
}

}  // namespace strata
