#include "models/layers/mlp.h"

namespace strata {

MLP::MLP(ParamLayout& layout, const MlpSpec& spec, const std::string& fc_name,
         const std::string& proj_name, int64_t C, LinearInit fc_init, LinearInit proj_init)
    : activation(spec.activation), hidden_local(spec.hidden / layout.tp()) {
  const int64_t F = spec.hidden;
  if (activation == MlpActivation::kSwiGlu)
    fc = ColumnParallelLinear(layout, fc_name, C, 2 * F, fc_init, spec.bias, {F, F});
  else
    fc = ColumnParallelLinear(layout, fc_name, C, F, fc_init, spec.bias);
  proj = RowParallelLinear(layout, proj_name, F, C, proj_init, spec.bias);
}

PartWork MLP::work(int64_t C, const MlpSpec& m, const WorkShape& s) {
  PartWork w = ColumnParallelLinear::work(C, m.fc_rows(), s);
  const double passes = m.activation == MlpActivation::kSwiGlu ? 3 : 2;
  w.elementwise(passes * s.tokens() * static_cast<double>(m.hidden) / s.t);
  w += RowParallelLinear::work(m.hidden, C, s);
  return w;
}

LayerActivations MLP::activations(int64_t C, const MlpSpec& m, const WorkShape& s) {
  LayerActivations a;
  a.saved = s.tokens() * static_cast<double>(m.fc_rows() + m.hidden) / s.t;
  a.backward = a.saved + (s.sp ? s.tokens() * static_cast<double>(C) : 0);
  return a;
}

double MLP::flops_per_token(int64_t C, const MlpSpec& m) {
  return 2.0 * static_cast<double>(C) * static_cast<double>(m.fc_rows() + m.hidden);
}

std::string MLP::split_reason(const MlpSpec& m, int t) {
  if (t >= 1 && m.hidden % t == 0) return "";
  return "tensor " + std::to_string(t) + " does not divide ffn " + std::to_string(m.hidden);
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
