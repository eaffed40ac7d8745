// attention.h — CPU self-attention core (causal, or bidirectional over the real keys of padded
// sequences): pure functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). The GEMMs go to OpenBLAS (gemm.h),
// the softmax loops use OpenMP. attention_backward ASSIGNS dqkv (one producer), so its buffer needs
// no zeroing and is never read. The CUDA kernels: kernels/cuda/flash_attention.h,
// flash_attention_tc.h and cudnn_attention.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team and OpenBLAS's thread count as set by
// set_num_threads() (threads.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::kernels::cpu {

// Grouped-query self-attention core. Which keys query i of sequence b sees: j ≤ i when causal
// (else every j), and j < key_len[b] when key_len (B) is given (the rest of the sequence is
// padding; 1 ≤ key_len[b] ≤ S). Every query row is computed, padded rows included.
// qkv (B, S, NH + 2·KVH, HS): per position, the NH query heads, then the KVH key heads, then the
// KVH value heads (this rank's heads only under tensor parallelism; KVH = NH is multi-head
// attention's (B, S, 3, NH, HS)). Query head h uses key/value head h / (NH/KVH); NH must be a
// multiple of KVH. out (B, S, NH, HS). att (B, NH, S, S): softmax probabilities saved for
// backward (entries of keys a query does not see are written as 0). Scores are scaled by 1/√HS.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int S, int NH, int KVH, int HS,
                       bool causal = true, const int32_t* key_len = nullptr);
// dqkv (B, S, NH + 2·KVH, HS) = gradients for q, k, v (a key/value head's summed over its query
// heads; 0 for padded keys). scratch: (S, S) per OpenMP thread, i.e. attention_scratch_elems(S)
// elements, owned by the caller. causal, key_len: the forward's.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, T* scratch, int B,
                        int S, int NH, int KVH, int HS, bool causal = true,
                        const int32_t* key_len = nullptr);
size_t attention_scratch_elems(int S);

// Generation: out (B, T, NH, HS) = causal attention of the queries q (B, T, NH, HS) of positions
// pos0 … pos0 + T − 1 over the key/value cache k, v (B, S_max, KVH, HS) (positions 0 … pos0 + T − 1
// filled): query t attends to positions 0 … pos0 + t; query head h uses key/value head
// h / (NH/KVH); scores scaled by 1/√HS; the softmax as attention_forward's.
template <class T>
void attention_decode(T* out, const T* q, const T* k, const T* v, int B, int Tn, int S_max, int NH,
                      int KVH, int HS, int pos0);

}  // namespace strata::kernels::cpu
