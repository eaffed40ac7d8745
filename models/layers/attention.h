// attention.h — tensor-parallel grouped-query self-attention: a column-parallel fused q/k/v
// projection (each rank computes its heads' queries, keys and values), rotary position
// embeddings on q and k where the model has them, the attention core on those heads (a backend
// op: the CPU kernels, Strata's flash kernels or cuDNN), and a row-parallel output projection
// that joins the residual stream.
//
// Heads: NH query heads and KVH key/value heads (KVH = NH: multi-head attention, GPT-2's; fewer:
// grouped-query attention, Llama's; 1: multi-query), head size HS = C / NH. The q/k/v weight's
// rows are three blocks [q (NH·HS); k (KVH·HS); v (KVH·HS)], each split over the tensor group, so
// a rank holds NH/t query heads and the KVH/t key/value heads they use (the config refuses a KVH
// that t does not divide: heads are never replicated or rounded).
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

namespace strata {

class SelfAttention {
 public:
  struct Saved {
    Tensor qkv;          // (B, S, (NH + 2·KVH)·HS/t) [q | k | v] of this rank's heads, rotated
    Tensor att;          // backend's saved state (Backend::attention_saved_shape), f32
    Tensor out;          // (B, S, NH·HS/t) the core's output, the projection's input
    Tensor key_lengths;  // (B) i32: the real keys of each sequence; undefined: all S
  };

  SelfAttention() = default;
  // qkv_name, proj_name: the two projections' parameter prefixes (`qkv_name`.weight, …). rope:
  // the model's rotary table (null: no rotation, GPT-2's learned positions). causal: decoders'
  // attention; false: every query sees every (real) key.
  SelfAttention(ParamLayout& layout, const std::string& qkv_name, const std::string& proj_name,
                int64_t C, int heads, int kv_heads, LinearInit qkv_init, LinearInit proj_init,
                bool bias, const RotaryEmbedding* rope, bool causal = true);

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

  ColumnParallelLinear qkv;
  RowParallelLinear proj;
  int heads_local = 0;     // NH / t
  int kv_heads_local = 0;  // KVH / t
  int64_t head_size = 0;
  const RotaryEmbedding* rope = nullptr;
  bool causal = true;

 private:
  // The backend's mask for the saved key lengths.
  AttentionMask mask(const Saved& s) const;
};

}  // namespace strata
