// attention_decode.h — CUDA generation with a key/value cache: pure functions on raw device
// buffers + shapes, launched on the caller's stream.
//
// Semantics are those of runtime/backend/backend.h ("generation with a key/value cache") and, for
// the attention, of kernels/cpu/attention.h's attention_decode (the reference beside them):
// - kv_cache_append: from qkv (B, T, NH + 2·KVH, HS) of the tokens at positions pos0 … pos0 + T − 1
//   copies the NH query heads to q (B, T, NH, HS) and the KVH key and value heads into k_cache,
//   v_cache (B, S_max, KVH, HS) at those positions (pos0 + T ≤ S_max). A copy: exact.
// - attention_decode: out (B, T, NH, HS) = causal attention of the queries q (B, T, NH, HS) over
//   the cache: query t (position pos0 + t) attends to positions 0 … pos0 + t, query head h to
//   key/value head h / (NH/KVH), scores scaled by 1/√HS. Computed in f32 with an online
//   (streaming) softmax, each output element rounded once where it is stored.
// Every operand is f32 or bf16 as t says (one type for all of a call's buffers).
//
// Refused with cudaErrorInvalidValue before launching anything: negative sizes, KVH < 1, NH not
// a multiple of KVH, pos0 < 0 or pos0 + T > S_max, and (attention_decode) HS > 128
// (kDecodeMaxHeadSize). Each function returns the launch's cudaError_t; zero-sized calls launch
// nothing and return cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

constexpr int kDecodeMaxHeadSize = 128;

cudaError_t kv_cache_append(void* q, void* k_cache, void* v_cache, const void* qkv, ElemType t,
                            int B, int T, int S_max, int NH, int KVH, int HS, int pos0,
                            cudaStream_t stream);

cudaError_t attention_decode(void* out, const void* q, const void* k_cache, const void* v_cache,
                             ElemType t, int B, int T, int S_max, int NH, int KVH, int HS, int pos0,
                             cudaStream_t stream);

}  // namespace strata::kernels::cuda
