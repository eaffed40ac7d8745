// qwen3_moe.h — the Qwen3-MoE family (the "qwen3_moe" architecture, Qwen3MoeForCausalLM): Llama's
// block (models/llama/llama.h) with Qwen3's per-head RMSNorm of the queries and keys before the
// rotation (self_attn.q_norm, self_attn.k_norm, epsilon model.rms_norm_eps), an explicit head size
// (model.head_dim) and a mixture of SwiGLU experts for its MLP (models/layers/moe.h): the router's
// softmax over every expert, the top model.num_experts_per_tok, renormalised when
// model.norm_topk_prob. Layer l is sparse unless Hugging Face's decoder_sparse_step and
// mlp_only_layers (model.decoder_sparse_step, model.mlp_only_layers; ModelConfig::sparse_layer)
// make it dense: then its MLP is Llama's SwiGLU of model.ffn_hidden_size (Hugging Face's
// intermediate_size), a second kind of block of the spec (TransformerSpec::variants). Qwen3-30B-A3B
// and Qwen3-235B-A22B have every layer sparse (step 1, no mlp_only_layers). The load-balancing
// loss pools the sparse layers only, as Hugging Face's does.
//
// Parameter names are Llama's plus layers.{l}.self_attn.q_norm, layers.{l}.self_attn.k_norm
// (HS each); a sparse layer's layers.{l}.mlp.gate (the router, (E, C)),
// layers.{l}.mlp.experts.gate_up_proj (E·2F, C: expert e's rows [gate_proj; up_proj]) and
// layers.{l}.mlp.experts.down_proj (E·C, F); a dense layer's layers.{l}.mlp.gate_up_proj (2F, C)
// and layers.{l}.mlp.down_proj (C, F), as Llama's. Hugging Face's files hold one tensor per
// expert (mlp.experts.{e}.gate_proj/up_proj/down_proj) and a dense layer's mlp.gate_proj,
// mlp.up_proj, mlp.down_proj (models/llama/hf_llama.cc).
//
// Thread-safety: pure functions.
#pragma once

namespace strata {

struct ArchSpec;
ArchSpec qwen3_moe_arch();

}  // namespace strata
