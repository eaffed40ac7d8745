#include "models/layers/attention.h"

namespace strata {

SelfAttention::SelfAttention(ParamLayout& layout, const std::string& qkv_name,
                             const std::string& proj_name, int64_t C, int heads, int kv_heads,
                             LinearInit qkv_init, LinearInit proj_init, bool bias,
                             const RotaryEmbedding* rope_, bool causal_)
    : heads_local(heads / layout.tp()),
      kv_heads_local(kv_heads / layout.tp()),
      head_size(C / heads),
      rope(rope_),
      causal(causal_) {
  const int64_t q_rows = heads * head_size, kv_rows = kv_heads * head_size;
  qkv = ColumnParallelLinear(layout, qkv_name, C, q_rows + 2 * kv_rows, qkv_init, bias,
                             {q_rows, kv_rows, kv_rows});
  proj = RowParallelLinear(layout, proj_name, q_rows, C, proj_init, bias);
}

AttentionMask SelfAttention::mask(const Saved& s) const {
  AttentionMask m;
  m.causal = causal;
  m.key_lengths = s.key_lengths.defined() ? &s.key_lengths : nullptr;
  return m;
}

Tensor SelfAttention::forward(const LayerEnv& env, const Tensor& x, const Tensor& residual,
                              Saved& s, const Tensor& key_lengths) const {
  s.key_lengths = key_lengths;
  s.qkv = qkv.forward(env, x);
  if (rope) rope->forward(env, s.qkv, heads_local, kv_heads_local);
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
  s.out = env.act({B, S, heads_local * head_size});
  env.be.attention_forward(s.out, s.att, s.qkv, heads_local, kv_heads_local, mask(s));
}

Tensor SelfAttention::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid,
                               const Tensor& x, Saved& s) const {
  const int64_t B = s.qkv.size(0), S = s.qkv.size(1);
  Tensor dout = env.act({B, S, heads_local * head_size});
  proj.backward(env, pass, &dout, proj.gather_output_grad(env, dresid), s.out);
  Tensor dqkv = env.act({B, S, qkv.out_local});
  env.be.attention_backward(dqkv, dout, s.qkv, s.out, s.att, heads_local, kv_heads_local, mask(s));
  dout = Tensor();
  if (rope) rope->backward(env, dqkv, heads_local, kv_heads_local);
  return qkv.backward(env, pass, dqkv, x);
}

}  // namespace strata
