#include "models/layers/layernorm.h"

namespace strata {

LayerNorm::LayerNorm(ParamLayout& layout, const std::string& name, int64_t C) {
  weight = layout.add({name + ".weight", {C}, ParamSplit::kReplicated, ParamInit::kOnes});
  bias = layout.add({name + ".bias", {C}, ParamSplit::kReplicated, ParamInit::kZeros});
}

void LayerNorm::forward(const LayerEnv& env, Saved& s, const Tensor& x) const {
  const int64_t B = x.size(0), S = x.size(1), C = x.size(2);
  s.out = env.act({B, S, C});
  s.mean = env.stat({B, S});
  s.rstd = env.stat({B, S});
  env.be.layernorm_forward(s.out, s.mean, s.rstd, x, env.w(weight), env.w(bias));
}

void LayerNorm::backward(const LayerEnv& env, const BackwardPass& pass, Tensor& dx,
                         const Tensor& dout, const Tensor& x, const Saved& s) const {
  Tensor dw = env.g(weight), db = env.g(bias);
  env.be.layernorm_backward(dx, dw, db, dout, x, env.w(weight), s.mean, s.rstd);
  if (env.tp.sequence_parallel() && pass.last_microbatch) {
    env.tp.sum(dw);
    env.tp.sum(db);
  }
}

}  // namespace strata
