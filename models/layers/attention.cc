#include "models/layers/attention.h"

#include "models/layers/ring_attention.h"

namespace strata {

SelfAttention::SelfAttention(ParamLayout& layout, const AttentionNames& names, int64_t C,
                             const AttentionSpec& spec, LinearInit qkv_init, LinearInit proj_init,
                             const RotaryEmbedding* rope_)
    : heads_local(spec.heads / layout.tp()),
      kv_heads_local(spec.kv_heads / layout.tp()),
      head_size(spec.head_size),
      rope(spec.rotary ? rope_ : nullptr),
      causal(spec.causal) {
  const int64_t q_rows = spec.q_width(), kv_rows = spec.kv_heads * head_size;
  qkv = ColumnParallelLinear(layout, names.qkv, C, q_rows + 2 * kv_rows, qkv_init, spec.bias,
                             {q_rows, kv_rows, kv_rows});
  if (spec.qk_norm) {
    q_norm = layout.add(
        {names.q_norm + ".weight", {head_size}, ParamSplit::kReplicated, ParamInit::kOnes});
    k_norm = layout.add(
        {names.k_norm + ".weight", {head_size}, ParamSplit::kReplicated, ParamInit::kOnes});
    qk_norm_eps = static_cast<float>(spec.qk_norm_eps);
  }
  proj = RowParallelLinear(layout, names.proj, q_rows, C, proj_init, spec.bias && spec.proj_bias);
}

void SelfAttention::normalise_qk(const LayerEnv& env, Tensor& qkv_t, Tensor& rstd) const {
  const int64_t rows = qkv_t.numel() / qkv.out_local * (heads_local + kv_heads_local);
  rstd = env.stat({rows});
  env.be.qk_rmsnorm_forward(qkv_t, rstd, env.w(q_norm), env.w(k_norm), heads_local, kv_heads_local,
                            qk_norm_eps);
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
  if (q_norm.valid()) {
    s.qkv_raw = env.act(s.qkv.shape());
    env.be.copy(s.qkv_raw, s.qkv);
    normalise_qk(env, s.qkv, s.qk_rstd);
  }
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
  if (env.cp) {  // context parallelism: the core over the whole sequences, saving each row's lse
    s.att = env.stat({B, heads_local, S});
    s.out = env.act({B, S, heads_local * head_size});
    ring_attention_forward(Ring{env.be, *env.cp, env.act_dtype}, s.out, s.att, s.qkv, heads_local,
                           kv_heads_local, causal,
                           s.key_lengths.defined() ? &s.key_lengths : nullptr);
    return;
  }
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
  if (env.cp)
    ring_attention_backward(Ring{env.be, *env.cp, env.act_dtype}, dqkv, dout, s.qkv, s.out, s.att,
                            heads_local, kv_heads_local, causal,
                            s.key_lengths.defined() ? &s.key_lengths : nullptr);
  else
    env.be.attention_backward(dqkv, dout, s.qkv, s.out, s.att, heads_local, kv_heads_local,
                              mask(s));
  dout = Tensor();
  if (rope) rope->backward(env, dqkv, heads_local, kv_heads_local);
  if (q_norm.valid()) {
    Tensor dq = env.g(q_norm), dk = env.g(k_norm);
    env.be.qk_rmsnorm_backward(dqkv, dq, dk, s.qkv_raw, env.w(q_norm), env.w(k_norm), s.qk_rstd,
                               heads_local, kv_heads_local);
    s.qkv_raw = Tensor();
    // Each rank normalised its own heads: the replicated weights' gradients are partial sums.
    if (env.tp.size() > 1 && pass.last_microbatch) {
      env.tp.sum(dq);
      env.tp.sum(dk);
    }
  }
  return qkv.backward(env, pass, dqkv, x);
}

Tensor SelfAttention::decode(const LayerEnv& env, const Tensor& x, const Tensor& residual,
                             Tensor& k_cache, Tensor& v_cache, int64_t pos0) const {
  const int64_t B = x.size(0), T = x.size(1);
  Tensor qkv_new = qkv.forward(env, x);  // (B, T, (NH + 2·KVH)·HS / t)
  if (q_norm.valid()) {
    Tensor rstd;
    normalise_qk(env, qkv_new, rstd);
  }
  if (rope) rope->forward_at(env, qkv_new, heads_local, kv_heads_local, pos0);
  Tensor q = env.act({B, T, heads_local, head_size});
  env.be.kv_cache_append(q, k_cache, v_cache, qkv_new, heads_local, kv_heads_local, pos0);
  qkv_new = Tensor();
  Tensor core = env.act({B, T, heads_local, head_size});
  env.be.attention_decode(core, q, k_cache, v_cache, heads_local, kv_heads_local, pos0);
  return proj.forward_residual(env, core.reshape({B, T, heads_local * head_size}), residual);
}

PartWork SelfAttention::work(int64_t C, const AttentionSpec& a, const WorkShape& s) {
  const double t = s.t, q = static_cast<double>(a.q_width()),
               qkv_width = static_cast<double>(a.qkv_width());
  PartWork w = ColumnParallelLinear::work(C, a.qkv_width(), s);
  w.attention_flops = (a.causal ? 0.5 : 1.0) * 4 * s.b * s.S * s.S * q / t;
  w.attention = {s.b, a.heads / t, a.kv_heads / t, s.S, static_cast<double>(a.head_size)};
  w.elementwise(2 * s.tokens() * (qkv_width + q) / t);
  const double qk = qkv_width - a.kv_heads * a.head_size;               // q and k of every head
  if (a.qk_norm) w.elementwise(2 * s.tokens() * (qkv_width + qk) / t);  // the copy, the norm
  if (a.rotary) w.elementwise(2 * s.tokens() * qk / t);
  w += RowParallelLinear::work(a.q_width(), C, s);
  return w;
}

LayerActivations SelfAttention::activations(int64_t C, const AttentionSpec& a, const WorkShape& s,
                                            bool flash) {
  const double t = s.t, q = static_cast<double>(a.q_width());
  const double probs = flash ? s.b * a.heads / t * s.S : s.b * a.heads / t * s.S * s.S;
  LayerActivations l;
  l.recomputed = probs + s.tokens() * q / t;  // the core's state and output
  l.saved = s.tokens() * static_cast<double>(a.qkv_width()) / t + l.recomputed;
  if (a.qk_norm)  // q/k/v before the norm, a statistic per head
    l.saved += s.tokens() * (static_cast<double>(a.qkv_width()) + a.heads + a.kv_heads) / t;
  l.backward = s.tokens() * (q + static_cast<double>(a.qkv_width())) / t +
               (s.sp ? s.tokens() * static_cast<double>(C) : 0);
  return l;
}

double SelfAttention::scratch_f32(const AttentionSpec& a, const WorkShape& s) {
  return s.tokens() * static_cast<double>(a.q_width()) / s.t + s.b * a.heads / s.t * s.S;
}

double SelfAttention::flops_per_token(int64_t C, const AttentionSpec& a, double S) {
  const double c = static_cast<double>(C);
  return 2.0 * c * static_cast<double>(a.qkv_width()) + 2.0 * static_cast<double>(a.q_width()) * c +
         core_flops_per_token(a, S);
}

double SelfAttention::core_flops_per_token(const AttentionSpec& a, double S) {
  return 4.0 * S * static_cast<double>(a.q_width());
}

std::string SelfAttention::split_reason(const AttentionSpec& a, int t) {
  const std::string by = "tensor " + std::to_string(t) + " does not divide ";
  if (t < 1 || a.heads % t != 0) return by + std::to_string(a.heads) + " heads";
  if (a.kv_heads % t != 0) return by + std::to_string(a.kv_heads) + " key/value heads";
  return "";
}

}  // namespace strata
