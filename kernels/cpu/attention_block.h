// attention_block.h — one block of ring attention on the CPU: the queries of one chunk of a
// sequence against the keys and values of another, with the log-sum-exp of every score row, so
// that blocks computed apart (context parallelism: keys and values travel around the ring of
// ranks that hold the sequence's chunks) merge into the attention over the whole sequence.
//
// Pure functions on raw row-major buffers, templates over T (float for training, double for the
// finite-difference tests). Layouts (contiguous; BlockLayout places them inside larger buffers):
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
#include <cstdint>

namespace strata::kernels::cpu {

enum class BlockMask { kFull, kCausal };

// Where a block's rows lie inside larger buffers, in elements of T: ring attention points q
// into the (B, S, NH + 2·KVH, HS) q/k/v of the layer, keys and values into that or a received
// (B, S, 2·KVH, HS) block, and a block may be some rows of the rank's sequence (one of its two
// chunks). A key/value position holds its KVH key heads, then its KVH value heads.
struct BlockLayout {
  int64_t q_ld = 0, q_batch = 0;    // q: between positions, between sequences
  int64_t o_ld = 0, o_batch = 0;    // out, dout, dq, the merged block's out: likewise
  int64_t kv_ld = 0, kv_batch = 0;  // kv, dkv: likewise
  int64_t lse_ld = 0;               // lse, delta: row (b, h) starts at (b·NH + h)·lse_ld
  // (B) or null: sequence b's keys [key_len[b], Sk) of the block are padding (key_len[b] ≤ 0:
  // the block has no key for it).
  const int32_t* key_len = nullptr;
};
// Contiguous buffers: q, out (B, Sq, NH, HS), kv (B, Sk, 2·KVH, HS), lse (B, NH, Sq).
BlockLayout dense_block_layout(int Sq, int Sk, int NH, int KVH, int HS);

// out (assigned) and lse of the block; kCausal needs Sq == Sk.
template <class T>
void attention_block_forward(T* out, T* lse, const T* q, const T* kv, int B, int Sq, int Sk, int NH,
                             int KVH, int HS, BlockMask mask, const BlockLayout& at);

// Adds block (out_b, lse_b) into the running (out, lse) of the same rows (lse −inf: empty); out_b
// and lse_b lie as out and lse do.
template <class T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int B, int Sq, int NH, int HS,
                     const BlockLayout& at);

// delta (B, NH, Sq) = Σ over HS of dout ⊙ out (the merged out): the backward's row term.
template <class T>
void attention_block_delta(T* delta, const T* dout, const T* out, int B, int Sq, int NH, int HS,
                           const BlockLayout& at);

// The block's gradients, ACCUMULATED: dq (B, Sq, NH, HS) += (laid out as out), dkv (B, Sk, 2·KVH,
// HS) += (a key/value head's summed over its query heads). lse, delta: the merged row's.
template <class T>
void attention_block_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* lse,
                              const T* delta, int B, int Sq, int Sk, int NH, int KVH, int HS,
                              BlockMask mask, const BlockLayout& at);

// The same on contiguous buffers (dense_block_layout).
template <class T>
void attention_block_forward(T* out, T* lse, const T* q, const T* kv, int B, int Sq, int Sk, int NH,
                             int KVH, int HS, BlockMask mask) {
  attention_block_forward(out, lse, q, kv, B, Sq, Sk, NH, KVH, HS, mask,
                          dense_block_layout(Sq, Sk, NH, KVH, HS));
}
template <class T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int B, int Sq, int NH,
                     int HS) {
  attention_merge(out, lse, out_b, lse_b, B, Sq, NH, HS, dense_block_layout(Sq, Sq, NH, 1, HS));
}
template <class T>
void attention_block_delta(T* delta, const T* dout, const T* out, int B, int Sq, int NH, int HS) {
  attention_block_delta(delta, dout, out, B, Sq, NH, HS, dense_block_layout(Sq, Sq, NH, 1, HS));
}
template <class T>
void attention_block_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* lse,
                              const T* delta, int B, int Sq, int Sk, int NH, int KVH, int HS,
                              BlockMask mask) {
  attention_block_backward(dq, dkv, dout, q, kv, lse, delta, B, Sq, Sk, NH, KVH, HS, mask,
                           dense_block_layout(Sq, Sk, NH, KVH, HS));
}

}  // namespace strata::kernels::cpu
