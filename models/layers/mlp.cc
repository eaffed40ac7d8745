#include "models/layers/mlp.h"

namespace strata {

MLP::MLP(ParamLayout& layout, MlpActivation activation_, const std::string& fc_name,
         const std::string& proj_name, int64_t C, int64_t F, LinearInit fc_init,
         LinearInit proj_init, bool bias)
    : activation(activation_), hidden_local(F / layout.tp()) {
  if (activation == MlpActivation::kSwiGlu)
    fc = ColumnParallelLinear(layout, fc_name, C, 2 * F, fc_init, bias, {F, F});
  else
    fc = ColumnParallelLinear(layout, fc_name, C, F, fc_init, bias);
  proj = RowParallelLinear(layout, proj_name, F, C, proj_init, bias);
}

namespace {

GeluKind gelu_kind(MlpActivation a) {
  return a == MlpActivation::kGeluErf ? GeluKind::kErf : GeluKind::kTanh;
}

}  // namespace

Tensor MLP::forward(const LayerEnv& env, const Tensor& x, const Tensor& residual, Saved& s) const {
  if (activation != MlpActivation::kSwiGlu) {
    fc.forward_gelu(env, x, &s.pre, &s.act, gelu_kind(activation));
  } else {
    s.pre = fc.forward(env, x);
    s.act = env.act({s.pre.size(0), s.pre.size(1), hidden_local});
    env.be.swiglu_forward(s.act, s.pre);
  }
  return proj.forward_residual(env, s.act, residual);
}

Tensor MLP::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid, const Tensor& x,
                     const Saved& s) const {
  const Tensor dout_full = proj.gather_output_grad(env, dresid);
  Tensor dpre = env.act({s.pre.size(0), s.pre.size(1), fc.out_local});
  if (activation != MlpActivation::kSwiGlu) {
    // d(pre) straight from d(out) through the projection and the GELU (one op: fused on a
    // GPU), then the projection's weight gradients.
    proj.backward_through_gelu(env, pass, dpre, dout_full, s.pre, s.act, gelu_kind(activation));
  } else {
    Tensor dact = env.act({s.pre.size(0), s.pre.size(1), hidden_local});
    proj.backward(env, pass, &dact, dout_full, s.act);
    env.be.swiglu_backward(dpre, dact, s.pre);
  }
  return fc.backward(env, pass, dpre, x);
}

}  // namespace strata
