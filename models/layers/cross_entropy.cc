#include "models/layers/cross_entropy.h"

#include "runtime/base/check.h"

namespace strata {
namespace {

// The (B, S) loss mask as the ops' per-row weights (N); undefined stays undefined.
Tensor rows_mask(const Tensor& loss_mask, int64_t N) {
  if (!loss_mask.defined()) return Tensor();
  STRATA_CHECK(loss_mask.numel() == N,
               "loss mask " << shape_string(loss_mask.shape()) << " for " << N << " positions");
  return loss_mask.reshape({N});
}

}  // namespace

LossSum VocabParallelCrossEntropy::forward(const LayerEnv& env, const Tensor& logits,
                                           const Tensor& targets, const Tensor& loss_mask,
                                           Saved& s) const {
  const int64_t N = logits.size(0);
  // Each shard's max and Σexp (one read of its logits) are brought to the group's max and
  // summed; the target logit is summed over the group too.
  s.row_max = env.stat({N});
  s.row_sumexp = env.stat({N});
  env.be.ce_row_stats(s.row_max, s.row_sumexp, logits, vocab.valid());
  if (over_group && env.tp.size() > 1) {
    Tensor local_max = env.stat({N});
    env.be.copy(local_max, s.row_max);
    env.tp.max(s.row_max);
    env.be.ce_rescale_sumexp(s.row_sumexp, local_max, s.row_max);
    env.tp.sum(s.row_sumexp);
  }
  Tensor target_logit = env.stat({N});
  env.be.ce_target_logit(target_logit, logits, targets, vocab.start, vocab.valid());
  if (over_group) env.tp.sum(target_logit);
  Tensor losses = env.stat({N});
  // A masked position's loss is exactly 0, even where its logits are not finite.
  const Tensor mask = rows_mask(loss_mask, N);
  env.be.ce_losses(losses, s.row_max, s.row_sumexp, target_logit, mask.defined() ? &mask : nullptr);
  LossSum l;
  l.sum = env.be.sum(losses);
  l.count = loss_mask.defined() ? env.be.sum(loss_mask) : static_cast<double>(N);
  return l;
}

PartWork VocabParallelCrossEntropy::work(double rows, double columns, const WorkShape& s,
                                         bool over_group) {
  PartWork w;
  w.logits = rows * columns;
  w.f32_fwd = 3 * w.logits;
  w.f32_bwd = 3 * w.logits;
  if (over_group && s.t > 1)
    for (int i = 0; i < 3; ++i)
      w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, rows});
  return w;
}

void VocabParallelCrossEntropy::backward(const LayerEnv& env, Tensor& dlogits, const Tensor& logits,
                                         const Saved& s, const Tensor& targets,
                                         const Tensor& loss_mask, float scale) const {
  const Tensor mask = rows_mask(loss_mask, logits.size(0));
  env.be.ce_backward(dlogits, logits, s.row_max, s.row_sumexp, targets, scale, vocab.start,
                     vocab.valid(), mask.defined() ? &mask : nullptr);
}

}  // namespace strata
