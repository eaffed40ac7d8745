// work.h — what a layer costs on one rank, as the layer itself describes it: its GEMMs, its
// attention core, its memory-bound passes, its collectives and the group each runs on (PartWork),
// and the activations it keeps for its backward pass (LayerActivations).
//
// Every layer of models/layers/ describes itself beside its code (a static `work` / `activations`
// of its sizes), the block sums its layers' descriptions (models/layers/block.h) and the model's
// self-description sums its parts (models/description.h): no architecture counts by hand, so the
// planner, the dry run, the memory check and the metrics read what the layers do.
//
// Counting conventions (docs/planner.md):
//   - elements, in the activation type unless a field says f32; a GEMM C (m, n) = A (m, k)·B (k, n)
//     is 2·m·n·k FLOPs forward, twice that backward ((m, k, n) and (n, k, m));
//   - an elementwise pass counts the elements it reads and writes; a layer's backward reads and
//     writes twice what its forward does (the gradients of its inputs and outputs);
//   - a collective counts the elements of the whole tensor it moves (an all-gather's output, a
//     reduce-scatter's input, the rows an all-to-all sends from this rank, its own share
//     included); the cost model prices each by its kind on its group's link.
//
// Thread-safety: plain values.
#pragma once

#include <vector>

namespace strata {

// How one rank holds its share of a layer.
struct RankShape {
  int tensor = 1;                  // tensor-parallel size t
  bool sequence_parallel = false;  // activations between tensor regions sharded along S
  int expert = 1;                  // expert-parallel size e: a mixture's experts over e data ranks
};

// One micro-batch on one rank: b sequences of S positions, a tensor group of t, an expert group
// of e.
struct WorkShape {
  double b = 1;
  double S = 0;
  int t = 1;
  bool sp = false;  // sequence parallelism (only with t > 1)
  int e = 1;        // expert parallelism: each rank holds E/e experts of a mixture

  WorkShape(int micro_batch, int seq_len, const RankShape& r)
      : b(micro_batch),
        S(seq_len),
        t(r.tensor),
        sp(r.sequence_parallel && r.tensor > 1),
        e(r.expert) {}
  double tokens() const { return b * S; }                  // b·S: a column-parallel region's rows
  double seq_local() const { return sp ? S / t : S; }      // S/t with sequence parallelism
  double tokens_local() const { return b * seq_local(); }  // the residual stream's rows
};

// One GEMM C (m, n) = A (m, k) · B (k, n): 2·m·n·k FLOPs.
struct GemmShape {
  double m = 0, n = 0, k = 0;
};

// The attention core of one micro-batch on one rank: `batch` sequences, `heads` query heads of
// this rank over `kv_heads` key/value heads, `seq` positions, head size `head_size`.
struct AttentionShape {
  double batch = 0, heads = 0, kv_heads = 0, seq = 0, head_size = 0;
};

// The process group a collective runs on (its size and link come from the layout): the tensor
// group (t consecutive ranks), or the expert group (e consecutive data ranks of one tensor
// coordinate, t·c world ranks apart).
enum class CommGroup { kTensor, kExpert };
// An all-to-all sends each member its share of this rank's `elements` (a mixture's routed rows
// to the ranks holding their experts, and back).
enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

struct Collective {
  CommGroup group = CommGroup::kTensor;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double elements = 0;  // of the whole tensor: an all-gather's output, a reduce-scatter's input
};

// The forward work of one micro-batch through a part on one rank.
struct PartWork {
  std::vector<GemmShape> gemms;
  double attention_flops =
      0;                     // attention core forward FLOPs as the kernels run them (causal: half)
  AttentionShape attention;  // its shape (heads 0: no attention in this part)
  double logits = 0;         // the head: logit elements the loss reads (b·s·V/t)
  double elementwise_fwd = 0;       // elements read + written by the other ops, forward
  double elementwise_bwd = 0;       // the same, backward
  double f32_fwd = 0, f32_bwd = 0;  // f32 elements read + written (loss over the logits)
  // Collectives of the forward and of the backward, in the order the layers issue them.
  std::vector<Collective> collectives_fwd, collectives_bwd;

  // A memory-bound pass of `elements` forward, twice that backward.
  void elementwise(double elements) {
    elementwise_fwd += elements;
    elementwise_bwd += 2 * elements;
  }
  // The work of `other` after this one's (GEMMs and collectives in order).
  PartWork& operator+=(const PartWork& other);
};

// What a layer keeps of one micro-batch, in elements: `saved` from its forward to its backward
// (of which `recomputed` is what selective recompute drops after the forward and rebuilds at the
// start of the backward), and `backward`, the working set its backward allocates on top.
struct LayerActivations {
  double saved = 0;
  double recomputed = 0;
  double backward = 0;
};

// Activation elements a part keeps from its forward to its backward (saved), and the working set
// its backward adds on top of them (transient).
struct ActivationElems {
  double saved = 0;
  double transient = 0;
  // Of `saved`: what the head's backward frees before the layers' backward starts (the
  // logits), so a layer's working set does not stack on it.
  double freed_before_layers = 0;
};

}  // namespace strata
