#include "models/layers/norm.h"

namespace strata {

Norm::Norm(ParamLayout& layout, NormKind kind_, const std::string& name, int64_t C, double eps_)
    : kind(kind_), eps(static_cast<float>(eps_)) {
  weight = layout.add({name + ".weight", {C}, ParamSplit::kReplicated, ParamInit::kOnes});
  if (kind == NormKind::kLayerNorm)
    bias = layout.add({name + ".bias", {C}, ParamSplit::kReplicated, ParamInit::kZeros});
}

PartWork Norm::work(int64_t C, const WorkShape& s) {
  PartWork w;
  w.elementwise(2 * s.tokens_local() * static_cast<double>(C));
  return w;
}

LayerActivations Norm::activations(NormKind kind, int64_t C, const WorkShape& s) {
  LayerActivations a;
  a.saved = s.tokens_local() * static_cast<double>(C) + stats_per_token(kind) * s.tokens_local();
  return a;
}

void Norm::forward(const LayerEnv& env, Saved& s, const Tensor& x) const {
  const int64_t B = x.size(0), S = x.size(1), C = x.size(2);
  s.out = env.act({B, S, C});
  s.rstd = env.stat({B, S});
  if (kind == NormKind::kRMSNorm) {
    env.be.rmsnorm_forward(s.out, s.rstd, x, env.w(weight), eps);
    return;
  }
  s.mean = env.stat({B, S});
  env.be.layernorm_forward(s.out, s.mean, s.rstd, x, env.w(weight), env.w(bias), eps);
}

void Norm::backward(const LayerEnv& env, const BackwardPass& pass, Tensor& dx, const Tensor& dout,
                    const Tensor& x, const Saved& s) const {
  Tensor dw = env.g(weight);
  if (kind == NormKind::kRMSNorm) {
    env.be.rmsnorm_backward(dx, dw, dout, x, env.w(weight), s.rstd);
  } else {
    Tensor db = env.g(bias);
    env.be.layernorm_backward(dx, dw, db, dout, x, env.w(weight), s.mean, s.rstd);
    if (env.tp.sequence_parallel() && pass.last_microbatch) env.tp.sum(db);
  }
  if (env.tp.sequence_parallel() && pass.last_microbatch) env.tp.sum(dw);
}

}  // namespace strata
