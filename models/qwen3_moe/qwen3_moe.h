// qwen3_moe.h — the Qwen3-MoE family (the "qwen3_moe" architecture, Qwen3MoeForCausalLM): Llama's
// block (models/llama/llama.h) with Qwen3's per-head RMSNorm of the queries and keys before the
// rotation (self_attn.q_norm, self_attn.k_norm, epsilon model.rms_norm_eps), an explicit head size
// (model.head_dim) and a mixture of SwiGLU experts for its MLP (models/layers/moe.h): the router's
// softmax over every expert, the top model.num_experts_per_tok, renormalised when
// model.norm_topk_prob. Every layer is sparse (Hugging Face's decoder_sparse_step 1 and no
// mlp_only_layers, as Qwen3-30B-A3B and Qwen3-235B-A22B are); a config.json with dense layers is
// refused.
//
// Parameter names are Llama's plus layers.{l}.self_attn.q_norm, layers.{l}.self_attn.k_norm
// (HS each), layers.{l}.mlp.gate (the router, (E, C)), layers.{l}.mlp.experts.gate_up_proj
// (E·2F, C: expert e's rows [gate_proj; up_proj]) and layers.{l}.mlp.experts.down_proj (E·C, F).
// Hugging Face's files hold one tensor per expert (mlp.experts.{e}.gate_proj/up_proj/down_proj,
// models/llama/hf_llama.cc).
//
// Thread-safety: pure functions.
#pragma once

#include "models/transformer/transformer.h"
#include "runtime/base/config.h"

namespace strata {

TransformerSpec qwen3_moe_spec(const ModelConfig& m);

struct ArchSpec;
ArchSpec qwen3_moe_arch();

}  // namespace strata
