#include "models/layers/mlp.h"

namespace strata {

GeluMLP::GeluMLP(ParamLayout& layout, const std::string& fc_name, const std::string& proj_name,
                 int64_t C, int64_t F, LinearInit fc_init, LinearInit proj_init, bool bias)
    : fc(layout, fc_name, C, F, fc_init, bias), proj(layout, proj_name, F, C, proj_init, bias) {}

Tensor GeluMLP::forward(const LayerEnv& env, const Tensor& x, const Tensor& residual,
                        Saved& s) const {
  fc.forward_gelu(env, x, &s.pre, &s.act);
  return proj.forward_residual(env, s.act, residual);
}

Tensor GeluMLP::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid,
                         const Tensor& x, const Saved& s) const {
  // d(pre) straight from d(out) through the projection and the GELU (one op: fused on a GPU),
  // then the projection's weight gradients.
  const Tensor dout_full = proj.gather_output_grad(env, dresid);
  Tensor dpre = env.act({s.pre.size(0), s.pre.size(1), fc.out_local});
  proj.backward_through_gelu(env, pass, dpre, dout_full, s.pre, s.act);
  return fc.backward(env, pass, dpre, x);
}

}  // namespace strata
