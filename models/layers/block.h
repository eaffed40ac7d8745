// block.h — the transformer block, composed once from slots: where the norms sit (before or
// after each sub-layer), the attention (AttentionSpec: grouped-query, rotary, causal or
// bidirectional over padded keys) and the MLP (MlpSpec: GELU, exact GELU, SwiGLU, or a mixture of
// SwiGLU experts, models/layers/moe.h). GPT-2, Llama, BERT, Mixtral and Qwen3-MoE are values of
// BlockSpec, not classes.
//
// The block is two sub-layers, k = 1 (attention) and k = 2 (MLP), each a norm and a function f
// that adds its result to a residual:
//   pre-norm  (GPT-2, Llama):  x_k = x_{k-1} + f_k(norm_k(x_{k-1}))
//   post-norm (BERT):          x_k = norm_k(x_{k-1} + f_k(x_{k-1}))
// Forward, backward (with the zero-bubble B/W split of the linear layers), recompute and decode
// all walk this one composition. Saved tensors per sub-layer: norm_k's output and statistics
// (norm_1, norm_2), the residual sum (res_1, res_2: pre-norm the sub-layer's output, post-norm
// norm_k's input), and f_k's own (attn, mlp).
//
// Backward: pre-norm accumulates the residual stream's gradient in place (one buffer through the
// block: the norm's backward adds into it); post-norm computes a new gradient per sub-layer.
//
// Parameters are declared in forward order — pre-norm: norm_1, q/k/v, proj, norm_2, fc, proj;
// post-norm: q/k/v, proj, norm_1, fc, proj, norm_2 — so [first, last] is the block's range of the
// flat buffers (gradient reports). Names are `prefix` + BlockNames (GPT-2's "h.3." + "ln_1").
//
// Self-description (models/layers/work.h): work() and activations() sum what the block's layers
// report of themselves, plus what the block itself keeps (the residual sums and the residual
// stream's gradient).
//
// Thread-safety: as the model.
#pragma once

#include <string>

#include "models/layers/attention.h"
#include "models/layers/mlp.h"
#include "models/layers/norm.h"
#include "models/layers/work.h"
#include "models/model.h"

namespace strata {

enum class NormPlacement { kPre, kPost };

// Parameter names of a block's layers, after the layer's prefix.
// A mixture of experts names its experts' fused [gate; up] weights mlp_fc, their down weights
// mlp_proj and its router `router`.
struct BlockNames {
  std::string norm_1, qkv, attn_proj, norm_2, mlp_fc, mlp_proj;
  std::string q_norm = {}, k_norm = {};  // with AttentionSpec::qk_norm
  std::string router = {};               // with MlpSpec::is_moe()
};

struct BlockSpec {
  NormPlacement placement = NormPlacement::kPre;
  NormSpec norm;
  AttentionSpec attention;
  MlpSpec mlp;
  BlockNames names;
  double init_std = 0.02;       // weights N(0, init_std); biases 0, norm weights 1
  double proj_init_std = 0.02;  // the two residual output projections (GPT-2: init_std/√(2L))
};

class TransformerBlock {
 public:
  // What the forward keeps. Shapes: B micro-batch, S sequence, Sl = S/t with sequence
  // parallelism (else S), C hidden.
  struct Saved {
    Norm::Saved norm_1, norm_2;   // (B, Sl, C) and statistics
    SelfAttention::Saved attn;    // q/k/v (B, S, (NH + 2·KVH)·HS/t), the core's state and output
    MLP::Saved mlp;               // (B, S, F/t or 2F/t) before and (B, S, F/t) after the activation
    MixtureOfExperts::Saved moe;  // with a mixture of experts instead of mlp
    Tensor res_1, res_2;          // (B, Sl, C) the residual sums
    // What the mixture's forward (not a recompute) reported of its routing; it outlives full
    // recompute's drop, as moe.aux_grad (set by the model before the backward) does.
    MixtureOfExperts::Stats moe_stats;
  };

  TransformerBlock() = default;
  // Declares the block's parameters into `layout` under `prefix` (hidden size C). rope: the
  // model's rotary table when spec.attention.rotary.
  TransformerBlock(ParamLayout& layout, const BlockSpec& spec, int64_t C, const std::string& prefix,
                   const RotaryEmbedding* rope);

  // x (B, Sl, C) → s. key_lengths: (B) i32 real keys per sequence, or undefined. What it keeps
  // follows `recompute` (selective drops the attention core, full keeps only the output);
  // `recomputing` (the backward's re-run) keeps everything.
  void forward(const LayerEnv& env, const Tensor& x, const Tensor& key_lengths, Recompute recompute,
               bool recomputing, Saved& s) const;
  // The block's output in s (the next block's input).
  const Tensor& output(const Saved& s) const;
  // dout: the gradient of the output; returns the gradient of x (B, Sl, C). Pre-norm adds into
  // dout in place and returns it (a caller hands it a buffer of its own); post-norm returns a new
  // tensor. Re-runs what `recompute` dropped first; s is consumed.
  Tensor backward(const LayerEnv& env, BackwardPass& pass, const Tensor& x,
                  const Tensor& key_lengths, Recompute recompute, Saved& s, Tensor dout) const;
  // Runs again, on s, what selective recompute repeats (`strata profile` times it).
  void rerun_selective_recompute(const LayerEnv& env, const Saved& s) const;

  // Generation: T new positions x (B, T, C) at pos0 … through the block, over its caches.
  Tensor decode(const LayerEnv& env, const Tensor& x, Tensor& k_cache, Tensor& v_cache,
                int64_t pos0) const;
  const SelfAttention& attention() const { return attn_; }
  bool is_moe() const { return moe_.spec.experts > 0; }

  ParamRef first, last;  // the block's parameters [first, last] in the flat buffers

  // ---- self-description of a block of `spec` with hidden size C ----
  static PartWork work(const BlockSpec& spec, int64_t C, const WorkShape& s);
  static ActivationElems activations(const BlockSpec& spec, int64_t C, const WorkShape& s,
                                     Recompute recompute, bool flash_attention);
  // Forward FLOPs per token (Megatron-LM's counting), and what `recompute` repeats of them.
  static double flops_per_token(const BlockSpec& spec, int64_t C, double S);
  static double recomputed_flops_per_token(const BlockSpec& spec, int64_t C, double S,
                                           Recompute recompute);
  // Why a tensor group of t cannot split the block ("" when it can).
  static std::string split_reason(const BlockSpec& spec, int t);

 private:
  // Sub-layer k (1: attention, 2: MLP) on `in`; returns x_k.
  // record: not a recompute (a mixture reports its routing in s.moe_stats).
  Tensor sublayer_forward(const LayerEnv& env, int k, const Tensor& in, const Tensor& key_lengths,
                          bool drop_core, bool record, Saved& s) const;
  // f_k of `in` plus `residual`.
  Tensor branch_forward(const LayerEnv& env, int k, const Tensor& in, const Tensor& residual,
                        const Tensor& key_lengths, bool record, Saved& s) const;
  // The gradient of f_k's input from that of its output dresid.
  Tensor branch_backward(const LayerEnv& env, BackwardPass& pass, int k, const Tensor& dresid,
                         const Tensor& in, Saved& s) const;
  const Norm& norm(int k) const { return k == 1 ? norm_1_ : norm_2_; }

  NormPlacement placement_ = NormPlacement::kPre;
  Norm norm_1_, norm_2_;
  SelfAttention attn_;
  MLP mlp_;
  MixtureOfExperts moe_;  // instead of mlp_ when the spec's MLP is a mixture
};

}  // namespace strata
