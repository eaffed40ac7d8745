// backend_checks.h — the argument checks and operand-type tests both backends run before a
// kernel (internal to runtime/; models never include it).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "runtime/check.h"
#include "runtime/tensor.h"

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
  STRATA_CHECK(qkv.dim() == 3, "attention qkv " << shape_string(qkv.shape()) << " is not (B, S, W)");
  STRATA_CHECK(NH >= 1 && KVH >= 1 && NH % KVH == 0,
               "attention heads " << NH << " are not a multiple of key/value heads " << KVH);
  const int64_t width = qkv.size(2), heads = NH + 2 * int64_t{KVH};
  STRATA_CHECK(width % heads == 0,
               "attention qkv width " << width << " is not (" << NH << " + 2 × " << KVH
                                      << ") heads × head size");
  return {qkv.size(0), qkv.size(1), width / heads};
}

// Rows of a tensor viewed as (N, last dim).
inline int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }

// Whether every (float) operand is f32; an absent optional operand (nullptr) counts as f32.
inline bool is_f32(const Tensor& t) { return t.dtype() == DType::kF32; }
inline bool is_f32(const Tensor* t) { return !t || t->dtype() == DType::kF32; }
template <typename... Ts>
bool all_f32(const Ts&... ts) {
  return (is_f32(ts) && ...);
}

}  // namespace strata::backend_checks
