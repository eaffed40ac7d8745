// mixtral.h — the Mixtral family (the "mixtral" architecture, MixtralForCausalLM): Llama's block
// (models/llama/llama.h: RMSNorm, rotary embeddings, grouped-query attention, no biases) whose MLP
// is a mixture of SwiGLU experts (models/layers/moe.h): model.num_experts experts of
// model.moe_intermediate_size (null: ffn_hidden_size), model.num_experts_per_tok per token, the
// top-k weights always renormalised, the load-balancing loss weighted by
// model.router_aux_loss_coef.
//
// Parameter names are Llama's with the mixture under block_sparse_moe: layers.{l}.
// block_sparse_moe.gate (the router, (E, C)), layers.{l}.block_sparse_moe.experts.gate_up_proj
// (E·2F, C: expert e's rows [w1 (gate); w3 (up)]), layers.{l}.block_sparse_moe.experts.down_proj
// (E·C, F: expert e's w2). Hugging Face's files hold one tensor per expert
// (block_sparse_moe.experts.{e}.w1/w2/w3, models/llama/hf_llama.cc).
//
// Thread-safety: pure functions.
#pragma once

namespace strata {

struct ArchSpec;
ArchSpec mixtral_arch();

}  // namespace strata
