// backend_checks.h — the argument checks and operand-type tests both backends run before a
// kernel (internal to runtime/; models never include it): one function per op family checks
// every operand's shape against the others (backend.h's layouts), so the CPU and CUDA backends
// refuse the same calls with the same messages.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/backend/backend.h"
#include "runtime/base/check.h"
#include "runtime/memory/tensor.h"

namespace strata::backend_checks {

inline int as_int(int64_t v) {
  STRATA_CHECK(v >= 0 && v <= INT32_MAX, "dimension " << v << " exceeds the int32 range");
  return static_cast<int>(v);
}

inline void expect_shape(const Tensor& t, const Shape& s, const char* what) {
  STRATA_CHECK(t.shape() == s, what << " has shape " << shape_string(t.shape()) << ", expected "
                                    << shape_string(s));
}

inline void expect_numel(const Tensor& t, int64_t n, const char* what) {
  STRATA_CHECK(t.numel() == n, what << " has " << t.numel() << " elements, expected " << n);
}

// Each operand has n elements (its name in the message otherwise); returns n.
struct NamedOperand {
  const Tensor& t;
  const char* what;
};
inline int64_t expect_numels(int64_t n, std::initializer_list<NamedOperand> operands) {
  for (const NamedOperand& o : operands) expect_numel(o.t, n, o.what);
  return n;
}

// An optional per-row weight (the cross-entropy's loss mask): (N) f32 when given.
inline void expect_row_weights(const Tensor* w, int64_t n, const char* what) {
  if (w == nullptr) return;
  STRATA_CHECK(w->dtype() == DType::kF32,
               what << " is " << to_string(w->dtype()) << ", expected f32");
  expect_numel(*w, n, what);
}

// The sizes of an attention's qkv (B, S, (NH + 2·KVH)·HS) (backend.h's layout), checked.
struct AttentionDims {
  int64_t B = 0, S = 0, HS = 0;
};
inline AttentionDims attention_dims(const Tensor& qkv, int NH, int KVH) {
  STRATA_CHECK(qkv.dim() == 3,
               "attention qkv " << shape_string(qkv.shape()) << " is not (B, S, W)");
  STRATA_CHECK(NH >= 1 && KVH >= 1 && NH % KVH == 0,
               "attention heads " << NH << " are not a multiple of key/value heads " << KVH);
  const int64_t width = qkv.size(2), heads = NH + 2 * int64_t{KVH};
  STRATA_CHECK(width % heads == 0, "attention qkv width " << width << " is not (" << NH << " + 2 × "
                                                          << KVH << ") heads × head size");
  return {qkv.size(0), qkv.size(1), width / heads};
}

// An attention mask's key lengths: (B) i32.
inline void expect_key_lengths(const Tensor& len, int64_t B) {
  STRATA_CHECK(len.dtype() == DType::kI32,
               "attention key lengths are " << to_string(len.dtype()) << ", expected i32");
  expect_numel(len, B, "attention key lengths");
}

// The sizes of a RoPE operand in the attention layout (attention_dims), checked against its
// angle table: the head size even (the rotated pairs are (x[i], x[i + HS/2])), and cos_sin an f32
// (S_max, HS) table with a row for every position.
inline AttentionDims rope_dims(const Tensor& qkv, const Tensor& cos_sin, int NH, int KVH,
                               const char* what) {
  const AttentionDims a = attention_dims(qkv, NH, KVH);
  STRATA_CHECK(a.HS % 2 == 0, what << " head size " << a.HS << " is odd: RoPE rotates pairs");
  STRATA_CHECK(cos_sin.dtype() == DType::kF32,
               "rope cos_sin is " << to_string(cos_sin.dtype()) << ", expected f32");
  STRATA_CHECK(cos_sin.dim() == 2 && cos_sin.size(1) == a.HS,
               "rope cos_sin has shape " << shape_string(cos_sin.shape()) << ", expected (S_max, "
                                         << a.HS << ") for head size " << a.HS);
  STRATA_CHECK(cos_sin.size(0) >= a.S, "rope cos_sin has " << cos_sin.size(0)
                                                           << " positions, fewer than the sequence "
                                                           << a.S << " of " << what);
  return a;
}

// A float operand (f32 or bf16: backend.h's ops accept any mix of the two), named otherwise.
inline void expect_float(const Tensor& t, const char* what) {
  STRATA_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16,
               what << " is " << to_string(t.dtype()) << ", expected f32 or bf16");
}

// The sizes of the per-head RMSNorm of the query and key heads (qk_rmsnorm_forward and
// _backward) on `qkv` (named `what`), a q/k/v or its gradient in the attention layout
// (attention_dims), checked: every operand a float, rstd B·S·(NH + KVH) statistics and each weight
// HS values.
inline AttentionDims qk_rmsnorm_dims(const Tensor& qkv, const Tensor& rstd, const Tensor& q_weight,
                                     const Tensor& k_weight, int NH, int KVH, const char* what) {
  const AttentionDims a = attention_dims(qkv, NH, KVH);
  for (const NamedOperand& o : {NamedOperand{qkv, what},
                                {rstd, "qk_rmsnorm rstd"},
                                {q_weight, "qk_rmsnorm q_weight"},
                                {k_weight, "qk_rmsnorm k_weight"}})
    expect_float(o.t, o.what);
  expect_numel(rstd, a.B * a.S * (NH + int64_t{KVH}), "qk_rmsnorm rstd");
  expect_numels(a.HS, {{q_weight, "qk_rmsnorm q_weight"}, {k_weight, "qk_rmsnorm k_weight"}});
  return a;
}
// The backward's: dqkv and the pre-norm x as qkv, the weight gradients as the weights.
inline AttentionDims qk_rmsnorm_backward_dims(const Tensor& dqkv, const Tensor& dq_weight,
                                              const Tensor& dk_weight, const Tensor& x,
                                              const Tensor& q_weight, const Tensor& k_weight,
                                              const Tensor& rstd, int NH, int KVH) {
  const AttentionDims a =
      qk_rmsnorm_dims(dqkv, rstd, q_weight, k_weight, NH, KVH, "qk_rmsnorm dqkv");
  for (const NamedOperand& o : {NamedOperand{x, "qk_rmsnorm x"},
                                {dq_weight, "qk_rmsnorm dq_weight"},
                                {dk_weight, "qk_rmsnorm dk_weight"}})
    expect_float(o.t, o.what);
  expect_numel(x, dqkv.numel(), "qk_rmsnorm x");
  expect_numels(a.HS, {{dq_weight, "qk_rmsnorm dq_weight"}, {dk_weight, "qk_rmsnorm dk_weight"}});
  return a;
}

// F of a SwiGLU input gate_up (N, 2F), checked: its last dimension must be even.
inline int64_t swiglu_width(const Tensor& gate_up, const char* what) {
  const int64_t width = gate_up.size(-1);
  STRATA_CHECK(width % 2 == 0, what << " last dimension " << width << " is odd, expected 2 × F");
  return width / 2;
}

// The sizes of kv_cache_append's operands (backend.h), checked: the qkv's (B, T, HS) and the
// caches' positions S_max.
struct KvCacheDims {
  int64_t B = 0, T = 0, HS = 0, S_max = 0;
};
inline KvCacheDims kv_cache_append_dims(const Tensor& q, const Tensor& k_cache,
                                        const Tensor& v_cache, const Tensor& qkv, int NH, int KVH,
                                        int64_t pos0) {
  const AttentionDims a = attention_dims(qkv, NH, KVH);
  const int64_t S_max = k_cache.size(1);
  expect_numel(q, a.B * a.S * NH * a.HS, "kv_cache_append q");
  expect_shape(k_cache, {a.B, S_max, KVH, a.HS}, "key cache");
  expect_shape(v_cache, {a.B, S_max, KVH, a.HS}, "value cache");
  STRATA_CHECK(pos0 >= 0 && pos0 + a.S <= S_max,
               "positions " << pos0 << " + " << a.S << " beyond the cache's " << S_max);
  return {a.B, a.S, a.HS, S_max};
}
// The same for attention_decode: q (B, T, NH, HS) over caches (B, S_max, KVH, HS).
inline KvCacheDims attention_decode_dims(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                         const Tensor& v_cache, int NH, int KVH, int64_t pos0) {
  STRATA_CHECK(q.dim() == 4 && q.size(2) == NH,
               "decode queries " << shape_string(q.shape()) << " are not (B, T, NH, HS)");
  const KvCacheDims d{q.size(0), q.size(1), q.size(3), k_cache.size(1)};
  expect_shape(k_cache, {d.B, d.S_max, KVH, d.HS}, "key cache");
  expect_shape(v_cache, {d.B, d.S_max, KVH, d.HS}, "value cache");
  expect_numel(out, q.numel(), "decode out");
  STRATA_CHECK(KVH >= 1 && NH % KVH == 0 && pos0 >= 0 && pos0 + d.T <= d.S_max,
               "decode heads " << NH << "/" << KVH << ", positions " << pos0 << " + " << d.T
                               << " of " << d.S_max);
  return d;
}

// Rows of a tensor viewed as (N, last dim).
inline int64_t rows(const Tensor& t) {
  return t.numel() / t.size(-1);
}

// Whether every (float) operand is f32; an absent optional operand (nullptr) counts as f32.
inline bool is_f32(const Tensor& t) {
  return t.dtype() == DType::kF32;
}
inline bool is_f32(const Tensor* t) {
  return !t || t->dtype() == DType::kF32;
}
template <typename... Ts>
bool all_f32(const Ts&... ts) {
  return (is_f32(ts) && ...);
}

// ---- the shapes of each op family ----

// A linear layer's operands, checked: w (OC, C), inp (N, C), out (N, OC), bias (OC) or null.
struct LinearDims {
  int64_t N = 0, C = 0, OC = 0;
};
inline LinearDims linear_dims(const Tensor& out, const Tensor& inp, const Tensor& w,
                              const Tensor* bias) {
  const int64_t N = rows(inp), C = inp.size(-1), OC = w.size(0);
  expect_shape(w, {OC, C}, "matmul weight");
  expect_numel(out, N * OC, "matmul out");
  if (bias) expect_numel(*bias, OC, "matmul bias");
  return {N, C, OC};
}
// Its input gradient's: dinp (N, C) from dout (N, OC) and w (OC, C).
inline LinearDims linear_backward_input_dims(const Tensor& dinp, const Tensor& dout,
                                             const Tensor& w) {
  const int64_t N = rows(dinp), C = dinp.size(-1), OC = w.size(0);
  expect_shape(w, {OC, C}, "matmul weight");
  expect_numel(dout, N * OC, "matmul dout");
  return {N, C, OC};
}
// Its weight gradient's: dw (OC, C) and dbias (OC) or null from dout (N, OC) and inp (N, C).
inline LinearDims linear_backward_weight_dims(const Tensor& dw, const Tensor* dbias,
                                              const Tensor& dout, const Tensor& inp) {
  const int64_t N = rows(inp), C = inp.size(-1), OC = dw.size(0);
  expect_shape(dw, {OC, C}, "matmul dweight");
  expect_numel(dout, N * OC, "matmul dout");
  if (dbias) expect_numel(*dbias, OC, "matmul dbias");
  return {N, C, OC};
}

// A norm's rows: inp viewed as (N, C).
struct NormDims {
  int64_t N = 0, C = 0;
};
// LayerNorm: out (N, C), mean and rstd (N), weight and bias (C).
inline NormDims layernorm_forward_dims(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                       const Tensor& inp, const Tensor& w, const Tensor& b) {
  const int64_t N = rows(inp), C = inp.size(-1);
  expect_numel(out, N * C, "layernorm out");
  expect_numels(N, {{mean, "layernorm mean"}, {rstd, "layernorm rstd"}});
  expect_numels(C, {{w, "layernorm weight"}, {b, "layernorm bias"}});
  return {N, C};
}
inline NormDims layernorm_backward_dims(const Tensor& dinp, const Tensor& dw, const Tensor& db,
                                        const Tensor& dout, const Tensor& inp, const Tensor& w,
                                        const Tensor& mean, const Tensor& rstd) {
  const int64_t N = rows(inp), C = inp.size(-1);
  expect_numels(N * C, {{dinp, "layernorm dinp"}, {dout, "layernorm dout"}});
  expect_numels(C, {{w, "layernorm weight"}, {dw, "layernorm dweight"}, {db, "layernorm dbias"}});
  expect_numels(N, {{mean, "layernorm mean"}, {rstd, "layernorm rstd"}});
  return {N, C};
}
// RMSNorm: out (N, C), rstd (N), weight (C).
inline NormDims rmsnorm_forward_dims(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                                     const Tensor& w) {
  const int64_t N = rows(inp), C = inp.size(-1);
  expect_numel(out, N * C, "rmsnorm out");
  expect_numel(rstd, N, "rmsnorm rstd");
  expect_numel(w, C, "rmsnorm weight");
  return {N, C};
}
inline NormDims rmsnorm_backward_dims(const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                                      const Tensor& inp, const Tensor& w, const Tensor& rstd) {
  const int64_t N = rows(inp), C = inp.size(-1);
  expect_numels(N * C, {{dinp, "rmsnorm dinp"}, {dout, "rmsnorm dout"}});
  expect_numels(C, {{w, "rmsnorm weight"}, {dw, "rmsnorm dweight"}});
  expect_numel(rstd, N, "rmsnorm rstd");
  return {N, C};
}

// SwiGLU's operands: gate_up (N, 2F) and out, or dout, (N, F); returns (N, F).
struct SwigluDims {
  int64_t N = 0, F = 0;
};
inline SwigluDims swiglu_dims(const Tensor& out, const Tensor& gate_up, const char* what) {
  const int64_t N = rows(gate_up), F = swiglu_width(gate_up, "swiglu gate_up");
  expect_numel(out, N * F, what);
  return {N, F};
}
// Its backward's: dgate_up as gate_up, dout (N, F).
inline SwigluDims swiglu_backward_dims(const Tensor& dgate_up, const Tensor& dout,
                                       const Tensor& gate_up) {
  const int64_t N = rows(gate_up), F = swiglu_width(gate_up, "swiglu gate_up");
  expect_numel(dgate_up, gate_up.numel(), "swiglu dgate_up");
  expect_numel(dout, N * F, "swiglu dout");
  return {N, F};
}

// The embedding's lookup (or its gradient, `act` being dout): tokens (B, S), the table (V, C),
// act (B, S, C), the learned positions (S_max ≥ S, C) or null.
struct EmbeddingDims {
  int64_t B = 0, S = 0, C = 0;
};
inline EmbeddingDims embedding_dims(const Tensor& act, const Tensor& tokens, const Tensor& table,
                                    const Tensor* positions, const char* what) {
  const int64_t B = tokens.size(0), S = tokens.size(1), C = table.size(1);
  expect_numel(act, B * S * C, what);
  if (positions) {
    STRATA_CHECK(
        positions->size(1) == C && positions->size(0) >= S,
        "positions " << shape_string(positions->shape()) << " for S = " << S << ", C = " << C);
  }
  return {B, S, C};
}

// The leading dimension of logits (N, ld) whose first `valid` columns are the vocabulary's.
inline int ce_ld(const Tensor& logits, int valid) {
  const int ld = as_int(logits.size(-1));
  STRATA_CHECK(valid >= 0 && valid <= ld, "ce valid columns " << valid << " of " << ld);
  return ld;
}
// The cross-entropy steps' per-row operands, for logits (N, ld); each returns N.
inline int64_t ce_row_stats_rows(const Tensor& row_max, const Tensor& row_sumexp,
                                 const Tensor& logits) {
  return expect_numels(rows(logits), {{row_max, "ce row_max"}, {row_sumexp, "ce row_sumexp"}});
}
inline int64_t ce_rescale_rows(const Tensor& row_sumexp, const Tensor& local_max,
                               const Tensor& row_max) {
  return expect_numels(row_sumexp.numel(), {{local_max, "ce local_max"}, {row_max, "ce row_max"}});
}
inline int64_t ce_target_rows(const Tensor& target_logit, const Tensor& logits,
                              const Tensor& targets) {
  return expect_numels(rows(logits), {{target_logit, "ce target_logit"}, {targets, "ce targets"}});
}
inline int64_t ce_losses_rows(const Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                              const Tensor& target_logit) {
  return expect_numels(
      losses.numel(),
      {{row_max, "ce row_max"}, {row_sumexp, "ce row_sumexp"}, {target_logit, "ce target_logit"}});
}
// dlogits as logits.
inline int64_t ce_backward_rows(const Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                                const Tensor& row_sumexp, const Tensor& targets) {
  expect_numel(dlogits, logits.numel(), "ce dlogits");
  return expect_numels(
      rows(logits),
      {{row_max, "ce row_max"}, {row_sumexp, "ce row_sumexp"}, {targets, "ce targets"}});
}

// The sequence-parallel layout change between bsc (B, S, C) and chunks (t, B, S/t, C), of one
// dtype.
struct SeqChunkDims {
  int64_t B = 0, S = 0, C = 0;
};
inline SeqChunkDims seq_chunk_dims(const Tensor& bsc, const Tensor& chunks, int t) {
  const int64_t B = bsc.size(0), S = bsc.size(1), C = bsc.size(2);
  STRATA_CHECK(t > 0 && S % t == 0, "sequence " << S << " % tensor " << t);
  expect_numel(chunks, bsc.numel(), "sequence chunks");
  STRATA_CHECK(bsc.dtype() == chunks.dtype(), "sequence chunks of another dtype");
  return {B, S, C};
}

// One AdamW range: gradient and moments the parameter's size.
inline void expect_adamw_range(const Backend::AdamWRange& r) {
  expect_numel(r.grad, r.param.numel(), "adamw grad");
  expect_numel(r.m, r.param.numel(), "adamw m");
  expect_numel(r.v, r.param.numel(), "adamw v");
}

}  // namespace strata::backend_checks
