#include "models/layers/block.h"

#include <algorithm>

namespace strata {

TransformerBlock::TransformerBlock(ParamLayout& layout, const BlockSpec& spec, int64_t C,
                                   const std::string& prefix, const RotaryEmbedding* rope)
    : placement_(spec.placement) {
  const BlockNames& n = spec.names;
  const LinearInit w{spec.init_std}, proj{spec.proj_init_std};
  const int before = static_cast<int>(layout.infos().size());
  auto declare_norm = [&](Norm& norm, const std::string& name) {
    norm = Norm(layout, spec.norm, prefix + name, C);
  };
  // Declared in forward order, so that the block's parameters are one range.
  if (placement_ == NormPlacement::kPre) declare_norm(norm_1_, n.norm_1);
  attn_ = SelfAttention(
      layout, {prefix + n.qkv, prefix + n.attn_proj, prefix + n.q_norm, prefix + n.k_norm}, C,
      spec.attention, w, proj, rope);
  declare_norm(placement_ == NormPlacement::kPre ? norm_2_ : norm_1_,
               placement_ == NormPlacement::kPre ? n.norm_2 : n.norm_1);
  if (spec.mlp.is_moe())
    moe_ = MixtureOfExperts(layout, spec.mlp.moe,
                            {prefix + n.router, prefix + n.mlp_fc, prefix + n.mlp_proj}, C,
                            spec.init_std, spec.proj_init_std);
  else
    mlp_ = MLP(layout, spec.mlp, prefix + n.mlp_fc, prefix + n.mlp_proj, C, w, proj);
  if (placement_ == NormPlacement::kPost) declare_norm(norm_2_, n.norm_2);
  first = ParamRef{before};
  last = ParamRef{static_cast<int>(layout.infos().size()) - 1};
}

const Tensor& TransformerBlock::output(const Saved& s) const {
  return placement_ == NormPlacement::kPre ? s.res_2 : s.norm_2.out;
}

Tensor TransformerBlock::branch_forward(const LayerEnv& env, int k, const Tensor& in,
                                        const Tensor& residual, const Tensor& key_lengths,
                                        bool record, Saved& s) const {
  if (k == 1) return attn_.forward(env, in, residual, s.attn, key_lengths);
  if (is_moe()) return moe_.forward(env, in, residual, s.moe, record ? &s.moe_stats : nullptr);
  return mlp_.forward(env, in, residual, s.mlp);
}

Tensor TransformerBlock::sublayer_forward(const LayerEnv& env, int k, const Tensor& in,
                                          const Tensor& key_lengths, bool drop_core, bool record,
                                          Saved& s) const {
  Norm::Saved& n = k == 1 ? s.norm_1 : s.norm_2;
  Tensor& res = k == 1 ? s.res_1 : s.res_2;
  if (placement_ == NormPlacement::kPre) {
    norm(k).forward(env, n, in);
    res = branch_forward(env, k, n.out, in, key_lengths, record, s);
  } else {
    res = branch_forward(env, k, in, in, key_lengths, record, s);
  }
  // Selective recompute: the attention core is recomputed from q/k/v in the backward pass, so
  // its S×S state (the largest activation at long sequences) and output are dropped.
  if (k == 1 && drop_core) SelfAttention::drop_core(s.attn);
  if (placement_ == NormPlacement::kPre) return res;
  norm(k).forward(env, n, res);
  return n.out;
}

void TransformerBlock::forward(const LayerEnv& env, const Tensor& x, const Tensor& key_lengths,
                               Recompute recompute, bool recomputing, Saved& s) const {
  const bool drop_core = recompute == Recompute::kSelective && !recomputing;
  const Tensor x_1 = sublayer_forward(env, 1, x, key_lengths, drop_core, !recomputing, s);
  sublayer_forward(env, 2, x_1, key_lengths, drop_core, !recomputing, s);
  if (recompute == Recompute::kFull && !recomputing) {
    // Keep only the block's output (the next block's input); the backward pass re-runs this
    // forward from the input to get the rest back.
    Tensor out = output(s);
    MixtureOfExperts::Stats stats = std::move(s.moe_stats);
    s = Saved();
    s.moe_stats = std::move(stats);
    (placement_ == NormPlacement::kPre ? s.res_2 : s.norm_2.out) = std::move(out);
  }
}

Tensor TransformerBlock::branch_backward(const LayerEnv& env, BackwardPass& pass, int k,
                                         const Tensor& dresid, const Tensor& in, Saved& s) const {
  if (k == 1) return attn_.backward(env, pass, dresid, in, s.attn);
  if (is_moe()) return moe_.backward(env, pass, dresid, s.moe);
  return mlp_.backward(env, pass, dresid, in, s.mlp);
}

Tensor TransformerBlock::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& x,
                                  const Tensor& key_lengths, Recompute recompute, Saved& s,
                                  Tensor dout) const {
  if (recompute == Recompute::kFull) {
    // The re-run forward refills s; what the model set for the backward stays.
    Tensor aux_grad = s.moe.aux_grad;
    forward(env, x, key_lengths, recompute, true, s);
    s.moe.aux_grad = std::move(aux_grad);
  }
  if (recompute == Recompute::kSelective) attn_.recompute_core(env, s.attn);
  Tensor d = std::move(dout);  // the gradient of x_k, from k = 2 down to the input
  for (int k = 2; k >= 1; --k) {
    const Norm::Saved& n = k == 1 ? s.norm_1 : s.norm_2;
    const Tensor& res = k == 1 ? s.res_1 : s.res_2;
    // x_{k-1}: the block's input, or the first sub-layer's output.
    const Tensor& in = k == 1 ? x : (placement_ == NormPlacement::kPre ? s.res_1 : s.norm_1.out);
    if (placement_ == NormPlacement::kPre) {
      // d holds d(x_k); through the residual it is also d(x_{k-1}), to which the branch's
      // gradient through the norm is added in place.
      const Tensor dn = branch_backward(env, pass, k, d, n.out, s);
      norm(k).backward(env, pass, d, dn, in, n);
    } else {
      // x_k = norm(res): d(res) through the norm, then d(x_{k-1}) = d(res) + the branch's.
      Tensor dres = env.act_zeros(res.shape());
      norm(k).backward(env, pass, dres, d, res, n);
      d = Tensor();
      d = branch_backward(env, pass, k, dres, in, s);
      env.be.add_inplace(d, dres);
    }
  }
  s = Saved();  // the block's activations are consumed
  return d;
}

void TransformerBlock::rerun_selective_recompute(const LayerEnv& env, const Saved& s) const {
  SelfAttention::Saved again;
  again.qkv = s.attn.qkv;
  again.key_lengths = s.attn.key_lengths;
  attn_.recompute_core(env, again);
}

Tensor TransformerBlock::decode(const LayerEnv& env, const Tensor& x, Tensor& k_cache,
                                Tensor& v_cache, int64_t pos0) const {
  Tensor h = x;
  for (int k = 1; k <= 2; ++k) {
    Norm::Saved n;
    MLP::Saved mlp;
    MixtureOfExperts::Saved moe;
    auto branch = [&](const Tensor& in, const Tensor& residual) {
      if (k == 1) return attn_.decode(env, in, residual, k_cache, v_cache, pos0);
      if (is_moe()) return moe_.forward(env, in, residual, moe, nullptr);
      return mlp_.forward(env, in, residual, mlp);
    };
    if (placement_ == NormPlacement::kPre) {
      norm(k).forward(env, n, h);
      h = branch(n.out, h);
    } else {
      norm(k).forward(env, n, branch(h, h));
      h = n.out;
    }
  }
  return h;
}

PartWork TransformerBlock::work(const BlockSpec& spec, int64_t C, const WorkShape& s) {
  const bool pre = spec.placement == NormPlacement::kPre;
  PartWork w;
  for (int k = 1; k <= 2; ++k) {
    if (pre) w += Norm::work(C, s);
    if (k == 1)
      w += SelfAttention::work(C, spec.attention, s);
    else
      w += spec.mlp.is_moe() ? MixtureOfExperts::work(C, spec.mlp.moe, s)
                             : MLP::work(C, spec.mlp, s);
    if (!pre) w += Norm::work(C, s);
  }
  return w;
}

ActivationElems TransformerBlock::activations(const BlockSpec& spec, int64_t C, const WorkShape& s,
                                              Recompute recompute, bool flash_attention) {
  const double residual = s.tokens_local() * static_cast<double>(C);  // one (B, Sl, C) tensor
  const LayerActivations norm = Norm::activations(spec.norm.kind, C, s);
  const LayerActivations attn = SelfAttention::activations(C, spec.attention, s, flash_attention);
  const LayerActivations mlp = spec.mlp.is_moe() ? MixtureOfExperts::activations(C, spec.mlp.moe, s)
                                                 : MLP::activations(C, spec.mlp, s);
  // Everything the forward keeps: the two norms, the attention, the MLP and the two residual
  // sums (res_1, res_2).
  const double all = 2 * norm.saved + attn.saved + mlp.saved + 2 * residual;
  // The backward's working set: the residual stream's gradient (pre-norm: one buffer; post-norm:
  // the output's, the sum's and the branch's at once) and the larger branch's own.
  const double gradients = (spec.placement == NormPlacement::kPre ? 1 : 3) * residual;
  const double grads = gradients + std::max(attn.backward, mlp.backward);
  switch (recompute) {
    case Recompute::kNone:
      return {all, grads, 0};
    case Recompute::kSelective:
      return {all - attn.recomputed, grads + attn.recomputed, 0};
    case Recompute::kFull:  // only the output is kept; the re-run forward stacks on the grads
      return {residual, grads + all, 0};
  }
  return {all, grads, 0};
}

double TransformerBlock::flops_per_token(const BlockSpec& spec, int64_t C, double S) {
  return SelfAttention::flops_per_token(C, spec.attention, S) +
         (spec.mlp.is_moe() ? MixtureOfExperts::flops_per_token(C, spec.mlp.moe)
                            : MLP::flops_per_token(C, spec.mlp));
}

double TransformerBlock::recomputed_flops_per_token(const BlockSpec& spec, int64_t C, double S,
                                                    Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      return SelfAttention::core_flops_per_token(spec.attention, S);
    case Recompute::kFull:
      return flops_per_token(spec, C, S);
  }
  return 0;
}

std::string TransformerBlock::split_reason(const BlockSpec& spec, int t) {
  const std::string attention = SelfAttention::split_reason(spec.attention, t);
  if (!attention.empty()) return attention;
  return spec.mlp.is_moe() ? MixtureOfExperts::split_reason(spec.mlp.moe, t)
                           : MLP::split_reason(spec.mlp, t);
}

}  // namespace strata
