// attention.h — tensor-parallel grouped-query self-attention: a column-parallel fused q/k/v
// projection (each rank computes its heads' queries, keys and values), rotary position
// embeddings on q and k where the model has them, the attention core on those heads (a backend
// op: the CPU kernels, Strata's flash kernels or cuDNN), and a row-parallel output projection
// that joins the residual stream.
//
// Heads: NH query heads and KVH key/value heads (KVH = NH: multi-head attention, GPT-2's; fewer:
// grouped-query attention, Llama's; 1: multi-query), head size HS (C / NH so far). The q/k/v
// weight's rows are three blocks [q (NH·HS); k (KVH·HS); v (KVH·HS)], each split over the tensor
// group, so a rank holds NH/t query heads and the KVH/t key/value heads they use (the config
// refuses a KVH that t does not divide: heads are never replicated or rounded).
//
// QK-norm (Qwen3's q_norm / k_norm, AttentionSpec::qk_norm): before the rotation each query head
// and each key head is RMS-normalised over its HS values, with one weight (HS) for all query heads
// and one for all key heads (Backend::qk_rmsnorm_forward). The weights are replicated over the
// tensor group, but each rank normalises only its heads: their gradients are partial sums, summed
// over the group on the last micro-batch (never deferred to a zero-bubble W pass).
//
// The core is causal (decoder models) or bidirectional (BERT's encoder), optionally over the real
// keys of padded sequences (a (B) i32 tensor of key lengths given to forward()). Selective
// recompute (Korthikanti et al.) drops what the core saves — the (B, NH/t, S, S) probabilities on
// the CPU, the log-sum-exp of each row with fused kernels — and its output after the forward, and
// recomputes them from the saved (rotated) q/k/v at the start of the layer's backward.
//
// Thread-safety: as the model.
#pragma once

#include <string>

#include "models/layers/linear.h"
#include "models/layers/parallel.h"
#include "models/layers/rope.h"
#include "models/layers/work.h"

namespace strata {

// The attention of a block: its heads and its options.
struct AttentionSpec {
  int heads = 0;          // NH query heads
  int kv_heads = 0;       // KVH key/value heads (NH: multi-head attention)
  int64_t head_size = 0;  // HS
  bool causal = true;     // decoders; false: every query sees every (real) key (BERT's encoder)
  bool rotary = false;    // q and k rotated by the model's rotary table (Llama)
  bool bias = true;       // biases on q/k/v and (with proj_bias) on the output projection
  bool proj_bias = true;  // Qwen2: false, biases on q/k/v alone
  bool qk_norm = false;   // per-head RMSNorm of q and k before the rotation (Qwen3)
  double qk_norm_eps = 1e-6;

  int64_t q_width() const { return heads * head_size; }
  int64_t qkv_width() const { return (heads + 2 * int64_t{kv_heads}) * head_size; }
};

// Parameter names (prefixes of `name`.weight, …) of an attention layer.
struct AttentionNames {
  std::string qkv, proj;
  std::string q_norm, k_norm;  // with AttentionSpec::qk_norm
};

class SelfAttention {
 public:
  struct Saved {
    Tensor qkv;          // (B, S, (NH + 2·KVH)·HS/t) [q | k | v] of this rank's heads, rotated
    Tensor qkv_raw;      // with QK-norm: q/k/v before the norm (the same shape)
    Tensor qk_rstd;      // with QK-norm: (B·S·(NH + KVH)/t) f32, each head's 1/rms
    Tensor att;          // backend's saved state (Backend::attention_saved_shape), f32
    Tensor out;          // (B, S, NH·HS/t) the core's output, the projection's input
    Tensor key_lengths;  // (B) i32: the real keys of each sequence; undefined: all S
  };

  SelfAttention() = default;
  // Declares the layer's parameters (`names`) for a hidden size C: q/k/v, with spec.qk_norm the
  // two norm weights (ones), the output projection. rope: the model's rotary table when
  // spec.rotary (it may be filled after this constructor runs).
  SelfAttention(ParamLayout& layout, const AttentionNames& names, int64_t C,
                const AttentionSpec& spec, LinearInit qkv_init, LinearInit proj_init,
                const RotaryEmbedding* rope);

  // residual + attention(x), reduced over the group; x (B, S_local, C) the layer's input.
  // key_lengths: (B) i32, sequence b's keys [len_b, S) are padding (undefined: none).
  Tensor forward(const LayerEnv& env, const Tensor& x, const Tensor& residual, Saved& s,
                 const Tensor& key_lengths = Tensor()) const;
  // Selective recompute: drop the core's saved state and output (after the forward) and
  // rebuild them from q/k/v (before the backward).
  static void drop_core(Saved& s);
  void recompute_core(const LayerEnv& env, Saved& s) const;
  // dresid: the gradient of the output (B, S_local, C). Returns the gradient of x, reduced over
  // the group (B, S_local, C); the saved tensors are consumed.
  Tensor backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid, const Tensor& x,
                  Saved& s) const;

  // Generation: residual + attention of T new positions x (B, T, C) at positions pos0 … over
  // the key/value caches (B, capacity, KVH/t, HS), which it appends their keys and values to.
  Tensor decode(const LayerEnv& env, const Tensor& x, const Tensor& residual, Tensor& k_cache,
                Tensor& v_cache, int64_t pos0) const;
  // The shape of each of its two caches.
  Shape cache_shape(int64_t batch, int64_t capacity) const {
    return {batch, capacity, kv_heads_local, head_size};
  }

  // ---- self-description (models/layers/work.h), for a hidden size C ----
  // q/k/v and the output projection, the core (causal: half the S×S scores), the q/k/v and
  // output layout copies, QK-norm (the copy of q/k/v it keeps, the norm of q and k) and the
  // rotation of q and k (a read and a write each).
  static PartWork work(int64_t C, const AttentionSpec& a, const WorkShape& s);
  // Keeps q/k/v (with QK-norm also before the norm, and each head's statistic) and the core's
  // state and output (selective recompute drops and rebuilds the latter two): the (B, NH/t, S, S)
  // probabilities, or with fused (flash) kernels the log-sum-exp of each row. Its backward holds
  // d(core output) and d(q/k/v), and with sp the gathered input.
  static LayerActivations activations(int64_t C, const AttentionSpec& a, const WorkShape& s,
                                      bool flash);
  // The fused backward's f32 scratch: the dq accumulator of the local heads and a row sum per
  // query row (cuDNN's workspace holds the same two).
  static double scratch_f32(const AttentionSpec& a, const WorkShape& s);
  // Forward FLOPs per token in Megatron-LM's counting: the projections' and the scores over the
  // full S×S (whatever the mask); and of those the core's alone (what selective recompute
  // repeats).
  static double flops_per_token(int64_t C, const AttentionSpec& a, double S);
  static double core_flops_per_token(const AttentionSpec& a, double S);
  // Why a tensor group of t cannot split it ("" when it can): heads are never replicated.
  static std::string split_reason(const AttentionSpec& a, int t);

  ColumnParallelLinear qkv;
  ParamRef q_norm, k_norm;  // (HS) each, with QK-norm
  float qk_norm_eps = 0;
  RowParallelLinear proj;
  int heads_local = 0;     // NH / t
  int kv_heads_local = 0;  // KVH / t
  int64_t head_size = 0;
  const RotaryEmbedding* rope = nullptr;
  bool causal = true;

 private:
  // The backend's mask for the saved key lengths.
  AttentionMask mask(const Saved& s) const;
  // QK-norm of fresh q/k/v in place; rstd receives each head's statistic.
  void normalise_qk(const LayerEnv& env, Tensor& qkv, Tensor& rstd) const;
};

}  // namespace strata
