// ops.h — CUDA kernels of the GPT model's row-wise and elementwise ops: pure functions on raw
// device buffers + shapes, launched on the caller's stream. The GEMMs are in gemm_lt.h, the
// attention core in flash_attention.h, the optimizer in optim.h.
//
// Semantics are those of kernels/cpu/ops.h (the reference beside them): row-major buffers,
// backward functions ACCUMULATE (+=) into their gradient outputs, ce_backward assigns. Element
// types: activation buffers (and, where named, weights) are f32 or bf16 as their ElemType says;
// statistics (LayerNorm mean/rstd, cross-entropy row stats and losses) and parameter gradients
// (LayerNorm dweight/dbias, dbias, dwte/dwpe) are always f32. Every kernel computes in f32 and
// rounds to nearest even where it stores bf16.
//
// Each function returns the launch's cudaError_t (cudaGetLastError after the launch) for the
// caller to check; zero-sized calls launch nothing and return cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

// dst (n) = src converted (f32 <-> bf16, round to nearest even), or copied when the types agree.
cudaError_t cast(void* dst, ElemType dst_type, const void* src, ElemType src_type, int64_t n,
                 cudaStream_t stream);

// out (N, OC) += bias (OC) on every row: the bias add for GEMMs whose epilogue cannot take it.
cudaError_t add_bias(void* out, ElemType out_type, const void* bias, ElemType bias_type, int64_t N,
                     int OC, cudaStream_t stream);
// dbias (OC) += Σ_n dout (N, OC).
cudaError_t bias_grad(float* dbias, const void* dout, ElemType dout_type, int64_t N, int OC,
                      cudaStream_t stream);

// LayerNorm over the last dimension, eps = 1e-5. inp, out (N, C) of type act; weight, bias (C) of
// type w_type; mean, rstd (N).
cudaError_t layernorm_forward(void* out, float* mean, float* rstd, const void* inp, ElemType act,
                              const void* weight, const void* bias, ElemType w_type, int64_t N,
                              int C, cudaStream_t stream);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dinp, dout, inp of type act; weight of w_type.
cudaError_t layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                               const void* inp, ElemType act, const void* weight, ElemType w_type,
                               const float* mean, const float* rstd, int64_t N, int C,
                               cudaStream_t stream);

// GELU, tanh approximation; all buffers of type t. gelu_backward: dinp = gelu'(inp) · dout
// (assigned: dinp is never read).
cudaError_t gelu_forward(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream);
cudaError_t gelu_backward(void* dinp, const void* inp, const void* dout, ElemType t, int64_t n,
                          cudaStream_t stream);

// out (B, S, C) = wte[token - vocab_start] (0 outside the shard) + wpe[s]; wte (V_local, C) and
// wpe (S_max, C) share w_type; wpe may be null.
cudaError_t embedding_forward(void* out, ElemType out_type, const int32_t* tokens, const void* wte,
                              const void* wpe, ElemType w_type, int B, int S, int C,
                              int vocab_start, int V_local, cudaStream_t stream);
// dwte += scatter of dout by token (own shard only); dwpe (S, C) += Σ_b dout; dwpe may be null.
cudaError_t embedding_backward(float* dwte, float* dwpe, const void* dout, ElemType dout_type,
                               const int32_t* tokens, int B, int S, int C, int vocab_start,
                               int V_local, cudaStream_t stream);

// The vocab-parallel cross-entropy steps of kernels/cpu/ops.h. logits (N, ld) of type
// logits_type, `valid` real columns; row stats (N) f32.
// ce_row_stats: the shard's row max and Σ exp(logit − max) in one pass over the logits (an
// online max and sum); ce_rescale_sumexp: row_sumexp *= exp(local_max − row_max).
cudaError_t ce_row_stats(float* row_max, float* row_sumexp, const void* logits,
                         ElemType logits_type, int64_t N, int ld, int valid, cudaStream_t stream);
cudaError_t ce_rescale_sumexp(float* row_sumexp, const float* local_max, const float* row_max,
                              int64_t N, cudaStream_t stream);
cudaError_t ce_target_logit(float* target_logit, const void* logits, ElemType logits_type,
                            const int32_t* targets, int64_t N, int ld, int vocab_start, int valid,
                            cudaStream_t stream);
cudaError_t ce_losses(float* losses, const float* row_max, const float* row_sumexp,
                      const float* target_logit, int64_t N, cudaStream_t stream);
// dlogits (N, ld) = scale · (softmax − onehot), 0 on padding columns. dlogits may be the logits
// buffer itself (same type): every element is read and then written by one thread.
cudaError_t ce_backward(void* dlogits, ElemType dlogits_type, const void* logits,
                        ElemType logits_type, const float* row_max, const float* row_sumexp,
                        const int32_t* targets, float scale, int64_t N, int ld, int vocab_start,
                        int valid, cudaStream_t stream);

// y (n) += x (n); out = a + b; y *= s.
cudaError_t add_inplace(void* y, ElemType y_type, const void* x, ElemType x_type, int64_t n,
                        cudaStream_t stream);
cudaError_t add(void* out, ElemType out_type, const void* a, ElemType a_type, const void* b,
                ElemType b_type, int64_t n, cudaStream_t stream);
cudaError_t scale_inplace(void* y, ElemType t, float s, int64_t n, cudaStream_t stream);
// *out += Σ x (Σ x² when `square`), accumulated in double.
cudaError_t sum(double* out, const void* x, ElemType t, int64_t n, bool square,
                cudaStream_t stream);

// bsc (B, S, C) <-> chunks (t, B, S/t, C) of elem_bytes-sized elements (2 or 4): to_chunks
// copies bsc into chunks, else chunks into bsc. S % t == 0.
cudaError_t seq_permute(void* bsc, void* chunks, size_t elem_bytes, int64_t B, int64_t S, int64_t C,
                        int t, bool to_chunks, cudaStream_t stream);

}  // namespace strata::kernels::cuda
