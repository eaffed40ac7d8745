// backend_checks.h — the argument checks and operand-type tests both backends run before a
// kernel (internal to runtime/; models never include it): one function per op family checks
// every operand's shape against the others (backend.h's layouts), so the CPU and CUDA backends
// refuse the same calls with the same messages.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

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

// An f32 tensor of n elements (statistics, f32 accumulators).
inline void expect_f32(const Tensor& t, int64_t n, const char* what) {
  STRATA_CHECK(t.dtype() == DType::kF32,
               what << " is " << to_string(t.dtype()) << ", expected f32");
  expect_numel(t, n, what);
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

// A ring attention block's operands (backend.h's AttentionBlock), checked: qkv (B, S, W) in the
// attention layout; kv either qkv itself (its keys start NH·HS in) or a (B, S_k, 2·KVH·HS) block
// of keys and values; the block's rows inside both; causal only on as many keys as queries.
struct AttentionBlockDims {
  AttentionDims a;
  int64_t S_k = 0;
  int64_t W = 0;        // qkv's row
  int64_t q = 0;        // NH·HS: the queries' part of it, and out's row
  int64_t kv_ld = 0;    // kv's row: W (inside) or 2·KVH·HS
  bool inside = false;  // kv is the q/k/v
};
inline AttentionBlockDims attention_block_dims(const Tensor& qkv, const Tensor& kv,
                                               const Backend::AttentionBlock& blk) {
  AttentionBlockDims g;
  g.a = attention_dims(qkv, blk.num_heads, blk.num_kv_heads);
  g.W = qkv.size(2);
  g.q = blk.num_heads * g.a.HS;
  const int64_t kvw = g.W - g.q;
  STRATA_CHECK(kv.dim() == 3 && kv.size(0) == g.a.B && (kv.size(2) == g.W || kv.size(2) == kvw),
               "attention block keys " << shape_string(kv.shape()) << " are neither q/k/v "
                                       << shape_string(qkv.shape()) << " nor (B, S, " << kvw
                                       << ")");
  STRATA_CHECK(kv.dtype() == qkv.dtype(), "attention block keys are " << to_string(kv.dtype())
                                                                      << ", q/k/v "
                                                                      << to_string(qkv.dtype()));
  g.inside = kv.size(2) == g.W;
  g.S_k = kv.size(1);
  g.kv_ld = kv.size(2);
  STRATA_CHECK(blk.q_rows.begin >= 0 && blk.q_rows.count >= 0 &&
                   blk.q_rows.begin + blk.q_rows.count <= g.a.S && blk.k_rows.begin >= 0 &&
                   blk.k_rows.count >= 0 && blk.k_rows.begin + blk.k_rows.count <= g.S_k,
               "attention block rows [" << blk.q_rows.begin << ", +" << blk.q_rows.count << ") x ["
                                        << blk.k_rows.begin << ", +" << blk.k_rows.count
                                        << ") outside " << g.a.S << " x " << g.S_k);
  STRATA_CHECK(!blk.causal || blk.q_rows.count == blk.k_rows.count,
               "a causal attention block of " << blk.q_rows.count << " x " << blk.k_rows.count);
  if (blk.key_lengths) expect_key_lengths(*blk.key_lengths, g.a.B);
  return g;
}

// Rows (B, S, NH·HS) of a block's output and their (B, NH, S) f32 statistics (lse, delta),
// checked; returns the head size.
inline int64_t attention_rows_dims(const Tensor& out, const Tensor& stat, int num_heads,
                                   const char* what) {
  STRATA_CHECK(out.dim() == 3 && num_heads >= 1 && out.size(2) % num_heads == 0,
               what << " output " << shape_string(out.shape()) << " is not (B, S, " << num_heads
                    << " heads x head size)");
  expect_f32(stat, out.size(0) * num_heads * out.size(1), what);
  return out.size(2) / num_heads;
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

// ---- mixture of experts (backend.h) ----

// An index operand: i32, named otherwise.
inline void expect_i32(const Tensor& t, const char* what) {
  STRATA_CHECK(t.dtype() == DType::kI32,
               what << " is " << to_string(t.dtype()) << ", expected i32");
}

// The most experts a layer may have (the CUDA routing kernel keeps a warp's experts in 32-bit
// masks of 32 per lane).
constexpr int kMaxExperts = 1024;

// N tokens, E experts, k per token.
struct MoeDims {
  int64_t N = 0;
  int E = 0, k = 0;
};
inline MoeDims moe_dims(int64_t N, int64_t E, int64_t k) {
  STRATA_CHECK(E >= 1 && E <= kMaxExperts,
               "moe experts " << E << " outside [1, " << kMaxExperts << "]");
  STRATA_CHECK(k >= 1 && k <= E, "moe experts per token " << k << " outside [1, " << E << "]");
  return {N, static_cast<int>(E), static_cast<int>(k)};
}

// moe_route: logits (N, E) and probs (N, E) floats, topk_idx (N, k) i32, topk_w (N, k) float.
inline MoeDims moe_route_dims(const Tensor& probs, const Tensor& topk_idx, const Tensor& topk_w,
                              const Tensor& logits, int k) {
  const MoeDims d = moe_dims(rows(logits), logits.size(-1), k);
  for (const NamedOperand& o : {NamedOperand{logits, "moe_route logits"},
                                {probs, "moe_route probs"},
                                {topk_w, "moe_route topk_w"}})
    expect_float(o.t, o.what);
  expect_i32(topk_idx, "moe_route topk_idx");
  expect_numel(probs, d.N * d.E, "moe_route probs");
  expect_numels(d.N * d.k, {{topk_idx, "moe_route topk_idx"}, {topk_w, "moe_route topk_w"}});
  return d;
}
// Its backward: probs and dlogits (N, E), topk_idx and dtopk_w (N, k), dprobs_expert (E) or
// undefined.
inline MoeDims moe_route_backward_dims(const Tensor& dlogits, const Tensor& dtopk_w,
                                       const Tensor& dprobs_expert, const Tensor& probs,
                                       const Tensor& topk_idx) {
  const MoeDims d = moe_dims(rows(probs), probs.size(-1), topk_idx.size(-1));
  for (const NamedOperand& o : {NamedOperand{dlogits, "moe_route dlogits"},
                                {dtopk_w, "moe_route dtopk_w"},
                                {probs, "moe_route probs"}})
    expect_float(o.t, o.what);
  expect_i32(topk_idx, "moe_route topk_idx");
  expect_numel(dlogits, d.N * d.E, "moe_route dlogits");
  expect_numels(d.N * d.k, {{topk_idx, "moe_route topk_idx"}, {dtopk_w, "moe_route dtopk_w"}});
  if (dprobs_expert.defined()) {
    expect_float(dprobs_expert, "moe_route dprobs_expert");
    expect_numel(dprobs_expert, d.E, "moe_route dprobs_expert");
  }
  return d;
}
// moe_dispatch_plan: topk_idx, topk_w and dest_row (N, k), counts and routed (E).
inline MoeDims moe_dispatch_dims(const Tensor& dest_row, const Tensor& counts, const Tensor& routed,
                                 const Tensor& topk_idx, const Tensor& topk_w, int num_experts) {
  const MoeDims d = moe_dims(rows(topk_idx), num_experts, topk_idx.size(-1));
  for (const NamedOperand& o : {NamedOperand{dest_row, "moe_dispatch_plan dest_row"},
                                {counts, "moe_dispatch_plan counts"},
                                {routed, "moe_dispatch_plan routed"},
                                {topk_idx, "moe_dispatch_plan topk_idx"}})
    expect_i32(o.t, o.what);
  expect_float(topk_w, "moe_dispatch_plan topk_w");
  STRATA_CHECK(d.N * d.k <= INT32_MAX,
               "moe_dispatch_plan: " << d.N << " tokens × " << d.k << " exceed the i32 rows");
  expect_numels(d.N * d.k,
                {{dest_row, "moe_dispatch_plan dest_row"}, {topk_w, "moe_dispatch_plan topk_w"}});
  expect_numels(d.E, {{counts, "moe_dispatch_plan counts"}, {routed, "moe_dispatch_plan routed"}});
  return d;
}

// Token rows (N, C) and expert-sorted rows (R, C) with the plan's dest_row (N, k) between them:
// `tokens` and `sorted` named by the caller.
struct MoeRowDims {
  int64_t N = 0, R = 0, C = 0;
  int k = 0;
};
inline MoeRowDims moe_row_dims(const Tensor& tokens, const Tensor& sorted, const Tensor& dest_row,
                               const char* tokens_name, const char* sorted_name) {
  expect_i32(dest_row, "moe dest_row");
  expect_float(tokens, tokens_name);
  expect_float(sorted, sorted_name);
  const int64_t C = tokens.size(-1), N = rows(tokens), k = dest_row.size(-1);
  STRATA_CHECK(k >= 1, "moe dest_row " << shape_string(dest_row.shape()) << " has no slots");
  expect_numel(dest_row, N * k, "moe dest_row");
  STRATA_CHECK(sorted.size(-1) == C, sorted_name << " has shape " << shape_string(sorted.shape())
                                                 << ", expected rows of " << C << " like "
                                                 << tokens_name);
  return {N, rows(sorted), C, static_cast<int>(k)};
}
// moe_unpermute's and its backward's weights: topk_w (N, k) as dest_row.
inline void expect_moe_weights(const Tensor& topk_w, const MoeRowDims& d, const char* what) {
  expect_float(topk_w, what);
  expect_numel(topk_w, d.N * d.k, what);
}

// moe_prob_sums: probs (N, E), sums (E).
inline MoeDims moe_prob_sums_dims(const Tensor& sums, const Tensor& probs) {
  const MoeDims d = moe_dims(rows(probs), probs.size(-1), 1);
  expect_float(probs, "moe_prob_sums probs");
  expect_float(sums, "moe_prob_sums sums");
  expect_numel(sums, d.E, "moe_prob_sums sums");
  return d;
}

// A grouped GEMM's operands: w (G, O, I), rows (G) of Σ = R, inp or dinp (R, I), out or dout
// (R, O); returns (G, R, I, O).
struct GroupedDims {
  int64_t G = 0, R = 0, I = 0, O = 0;
};
inline GroupedDims grouped_matmul_dims(const Tensor& w, const std::vector<int64_t>& rows_per_group,
                                       const Tensor& in, const Tensor& out, const char* w_name,
                                       const char* in_name, const char* out_name) {
  STRATA_CHECK(w.dim() == 3,
               w_name << " has shape " << shape_string(w.shape()) << ", expected (groups, O, I)");
  const GroupedDims d{w.size(0), rows(in), w.size(2), w.size(1)};
  STRATA_CHECK(static_cast<int64_t>(rows_per_group.size()) == d.G,
               "grouped matmul: " << rows_per_group.size() << " row counts for " << d.G
                                  << " groups of " << w_name);
  int64_t total = 0;
  for (const int64_t r : rows_per_group) {
    STRATA_CHECK(r >= 0, "grouped matmul: a group of " << r << " rows");
    total += r;
  }
  STRATA_CHECK(in.size(-1) == d.I, in_name << " has shape " << shape_string(in.shape())
                                           << ", expected rows of " << d.I << " (" << w_name << " "
                                           << shape_string(w.shape()) << ")");
  STRATA_CHECK(total == d.R, "grouped matmul: the groups' rows sum to " << total << ", " << in_name
                                                                        << " has " << d.R);
  expect_numel(out, d.R * d.O, out_name);
  return d;
}

// One AdamW range: gradient and moments the parameter's size.
inline void expect_adamw_range(const Backend::AdamWRange& r) {
  expect_numel(r.grad, r.param.numel(), "adamw grad");
  expect_numel(r.m, r.param.numel(), "adamw m");
  expect_numel(r.v, r.param.numel(), "adamw v");
}

}  // namespace strata::backend_checks
