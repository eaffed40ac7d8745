// attention_block.h — ring attention's blocks on CUDA (context parallelism:
// models/layers/ring_attention.h; the CPU's are kernels/cpu/attention_block.h, with the same
// mathematics): the queries of one chunk of a sequence against the keys and values of another,
// with the log-sum-exp of every score row, so that blocks computed apart merge into the attention
// over the whole sequence.
//
// The forward and backward are the flash kernels of flash_attention.h run on a block's rows
// (FlashRows: strides, Sq query and Sk key rows, causal on the same positions or full, key
// lengths offset by the block's first key position): f32 on CUDA cores in true f32, bf16 on
// tensor cores, results rounded once. The backward takes the MERGED rows' lse and D (the whole
// sequence's softmax) and ADDS into f32 accumulators: dq laid out as out, dkv as the keys (a
// (B, Sk, 2·KVH, HS) block: KVH key heads, then KVH value heads, a key/value head's gradient
// summed over its query heads), so the blocks' gradients summed over the ring are the whole
// attention's.
//
// Thread-safety: none needed (no state); calls are ordered by their stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elem_type.h"
#include "kernels/cuda/flash_attention.h"

namespace strata::kernels::cuda {

// out (the operands' type) and lse (f32) of the rows of r, assigned; a row with no real key gets
// out 0 and lse −inf. q and k point at row 0, head 0 of the block's queries and keys.
cudaError_t attention_block_forward(void* out, float* lse, const void* q, const void* k,
                                    ElemType type, const FlashRows& r, cudaStream_t stream);

// dq (f32, laid out as out) += and dkv (f32, laid out as the keys) += the block's gradients,
// given the merged rows' lse and delta (attention_block_delta).
cudaError_t attention_block_backward(float* dq, float* dkv, const void* dout, const void* q,
                                     const void* k, const float* lse, const float* delta,
                                     ElemType type, const FlashRows& r, cudaStream_t stream);

// (out, lse) of rows [r0, r0 + rows) += the block (out_b, lse_b) laid out as they are: with
// L = log(e^{L_a} + e^{L_b}), out = e^{L_a − L}·out_a + e^{L_b − L}·out_b in f32, rounded once to
// the type (an empty side, lse −inf, takes the other). out, out_b (B, S, NH·HS); lse, lse_b (B,
// NH, S).
cudaError_t attention_block_merge(void* out, float* lse, const void* out_b, const float* lse_b,
                                  ElemType type, int B, int S, int NH, int HS, int r0, int rows,
                                  cudaStream_t stream);

// delta (B, NH, S) f32 = Σ over HS of dout ⊙ out, out and dout (B, S, NH·HS).
cudaError_t attention_block_delta(float* delta, const void* dout, const void* out, ElemType type,
                                  int B, int S, int NH, int HS, cudaStream_t stream);

// kv (tokens, width − q) = the last width − q elements of each of qkv's `tokens` rows of
// `width`: the key and value heads a ring step sends.
cudaError_t attention_kv_extract(void* kv, const void* qkv, ElemType type, int64_t tokens,
                                 int64_t width, int64_t q, cudaStream_t stream);

// dqkv (tokens, q + n) in its type = [dq (tokens, q) | dkv (tokens, n)] from the f32
// accumulators, assigned.
cudaError_t attention_qkv_assemble(void* dqkv, const float* dq, const float* dkv, ElemType type,
                                   int64_t tokens, int64_t q, int64_t n, cudaStream_t stream);

}  // namespace strata::kernels::cuda
