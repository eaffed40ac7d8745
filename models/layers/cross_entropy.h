// cross_entropy.h — the vocab-parallel cross-entropy of Megatron-LM: no rank ever holds the
// full logits.
//
// Each rank holds the logits of its vocabulary shard (VocabShard). The forward pass takes the
// shard's row max and Σ exp (one read of its logits), brings every shard's sum to the group's
// max and sums them, and sums the target's logit over the group (the shard holding the target
// contributes it, the others 0); loss = log Σexp + max − target logit, per token. Padded
// vocabulary columns are excluded everywhere.
//
// Which tokens count: every position, or those with a 1 in the loss mask (B, S) f32 (a 0
// position contributes neither loss nor gradient). A target outside [0, V) — PyTorch's
// ignore_index -100, say — selects no logit; give such positions a 0 in the mask. The loss
// returns its sum together with the number of tokens it summed, so a caller averages over the
// tokens that count (masked language modelling, padding) and not over B·S.
//
// A classifier whose logits every rank holds whole (BERT's 2-way sentence head) uses the same
// layer with over_group false: no reduction over the group, every rank the same loss.
//
// Thread-safety: as the model.
#pragma once

#include "models/layers/embedding.h"
#include "models/layers/parallel.h"
#include "models/layers/work.h"
#include "models/model.h"

namespace strata {

class VocabParallelCrossEntropy {
 public:
  struct Saved {
    Tensor row_max;     // (N) f32 over the whole vocabulary
    Tensor row_sumexp;  // (N) f32
  };

  VocabParallelCrossEntropy() = default;
  explicit VocabParallelCrossEntropy(const VocabShard& v, bool over_group_ = true)
      : vocab(v), over_group(over_group_) {}

  // logits (N, V/t) of this rank's shard, targets (N) i32, loss_mask (N) f32 or undefined.
  // Returns Σ of the counted tokens' losses and how many there are.
  LossSum forward(const LayerEnv& env, const Tensor& logits, const Tensor& targets,
                  const Tensor& loss_mask, Saved& s) const;
  // dlogits (N, V/t) = scale · (softmax − onehot(target)) on the counted rows, 0 elsewhere
  // (assigned).
  void backward(const LayerEnv& env, Tensor& dlogits, const Tensor& logits, const Saved& s,
                const Tensor& targets, const Tensor& loss_mask, float scale) const;

  // `rows` rows of `columns` logits on this rank: the fp32 loss reads them for its statistics,
  // its target and its gradient (three passes each way), and over the group reduces three values
  // per row (the row max, Σexp and the target logit).
  static PartWork work(double rows, double columns, const WorkShape& s, bool over_group = true);
  // It keeps two f32 statistics per row.
  static double saved(double rows) { return 2 * rows; }

  VocabShard vocab;
  bool over_group = true;  // false: the logits are whole on every rank
};

}  // namespace strata
