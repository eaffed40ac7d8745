#include "models/layers/attention.h"

namespace strata {

SelfAttention::SelfAttention(ParamLayout& layout, const std::string& qkv_name,
                             const std::string& proj_name, int64_t C, int heads,
                             LinearInit qkv_init, LinearInit proj_init, bool bias)
    : qkv(layout, qkv_name, C, 3 * C, qkv_init, bias, /*qkv=*/true),
      proj(layout, proj_name, C, C, proj_init, bias),
      heads_local(heads / layout.tp()) {}

Tensor SelfAttention::forward(const LayerEnv& env, const Tensor& x, const Tensor& residual,
                              Saved& s) const {
  s.qkv = qkv.forward(env, x);
  recompute_core(env, s);
  return proj.forward_residual(env, s.out, residual);
}

void SelfAttention::drop_core(Saved& s) {
  s.att = Tensor();
  s.out = Tensor();
}

void SelfAttention::recompute_core(const LayerEnv& env, Saved& s) const {
  const int64_t B = s.qkv.size(0), S = s.qkv.size(1);
  s.att = env.stat(env.be.attention_saved_shape(B, heads_local, S));
  s.out = env.act({B, S, qkv.out_local / 3});
  env.be.attention_forward(s.out, s.att, s.qkv, heads_local, heads_local);
}

Tensor SelfAttention::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid,
                               const Tensor& x, Saved& s) const {
  const int64_t B = s.qkv.size(0), S = s.qkv.size(1);
  Tensor dout = env.act({B, S, qkv.out_local / 3});
  proj.backward(env, pass, &dout, proj.gather_output_grad(env, dresid), s.out);
  Tensor dqkv = env.act({B, S, qkv.out_local});
  env.be.attention_backward(dqkv, dout, s.qkv, s.out, s.att, heads_local, heads_local);
  dout = Tensor();
  return qkv.backward(env, pass, dqkv, x);
}

}  // namespace strata
