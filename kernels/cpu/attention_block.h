// attention_block.h — one block of ring attention on the CPU: the queries of one chunk of a
// sequence against the keys and values of another, with the log-sum-exp of every score row, so
// that blocks computed apart (context parallelism: keys and values travel around the ring of
// ranks that hold the sequence's chunks) merge into the attention over the whole sequence.
//
// Pure functions on raw row-major buffers, templates over T (float for training, double for the
// finite-difference tests). Layouts:
//   q   (B, Sq, NH, HS)      the block's queries (this rank's heads)
//   kv  (B, Sk, 2·KVH, HS)   per key position its KVH key heads, then its KVH value heads: what a
//                            ring step sends (grouped-query attention sends only these)
//   out (B, Sq, NH, HS)      lse (B, NH, Sq): log Σ_j exp(s_ij) over the keys the row sees,
//                            s_ij = q_i · k_j / √HS; −inf for a row that sees none
// Query head h uses key/value head h / (NH/KVH). Masks between two chunks (BlockMask): kFull (the
// key chunk lies wholly before the query chunk) or kCausal (the same chunk: query i sees keys
// j ≤ i). A pair whose key chunk lies wholly after the query chunk is never computed.
//
// The merge of blocks (attention_merge) is the flash-attention rescaling: with L = log(e^{L_a} +
// e^{L_b}), out = e^{L_a − L}·out_a + e^{L_b − L}·out_b. The backward of a block takes the MERGED
// out and lse of the whole row (the softmax over every key of the sequence): P = exp(s − lse),
// dP = dout · vᵀ, D = Σ dout ⊙ out (attention_block_delta), dS = P ⊙ (dP − D); then
// dq += dS · k / √HS, dk += dSᵀ · q / √HS, dv += Pᵀ · dout, so the blocks' gradients summed over
// the ring are the whole attention's.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team (one (batch, key/value head) pair per thread).
#pragma once

#include <cstddef>

namespace strata::kernels::cpu {

enum class BlockMask { kFull, kCausal };

// out (assigned) and lse of the block; kCausal needs Sq == Sk.
template <class T>
void attention_block_forward(T* out, T* lse, const T* q, const T* kv, int B, int Sq, int Sk, int NH,
                             int KVH, int HS, BlockMask mask);

// Adds block (out_b, lse_b) into the running (out, lse) of the same rows (lse −inf: empty).
template <class T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int B, int Sq, int NH, int HS);

// delta (B, NH, Sq) = Σ over HS of dout ⊙ out (the merged out): the backward's row term.
template <class T>
void attention_block_delta(T* delta, const T* dout, const T* out, int B, int Sq, int NH, int HS);

// The block's gradients, ACCUMULATED: dq (B, Sq, NH, HS) +=, dkv (B, Sk, 2·KVH, HS) += (a
// key/value head's summed over its query heads). lse, delta: the merged row's.
template <class T>
void attention_block_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* lse,
                              const T* delta, int B, int Sq, int Sk, int NH, int KVH, int HS,
                              BlockMask mask);

}  // namespace strata::kernels::cpu
