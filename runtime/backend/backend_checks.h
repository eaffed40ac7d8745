// backend_checks.h — the argument checks and operand-type tests both backends run before a
// kernel (internal to runtime/; models never include it).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

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

}  // namespace strata::backend_checks
