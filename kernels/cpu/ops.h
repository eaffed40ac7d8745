// ops.h — CPU compute primitives of the GPT model: pure functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). GEMMs go to OpenBLAS
// (sgemm/dgemm); elementwise and reduction loops use OpenMP. Backward functions ACCUMULATE
// (+=) into parameter gradients, so they sum over micro-batches, and into LayerNorm's input
// gradient, the residual stream's, which sums over its branches; an input gradient with one
// producer (matmul, GELU, attention, cross-entropy) is ASSIGNED, so its buffer needs no zeroing
// and is never read. Pointers documented as "may be null" skip that output.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team and OpenBLAS's thread count as set by
// set_num_threads().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace strata::kernels::cpu {

// bfloat16 as its 16 raw bits (the upper half of an IEEE float).
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Round to nearest, ties to even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
void cast_f32_to_bf16(uint16_t* dst, const float* src, size_t n);
void cast_bf16_to_f32(float* dst, const uint16_t* src, size_t n);

// Threads for OpenMP loops and OpenBLAS (process-wide).
void set_num_threads(int n);
int num_threads();
// "openmp", "pthread" or "serial": how the OpenBLAS in use was built.
const char* blas_parallel_mode();

// C (M, N) = alpha * op(A) * op(B) + beta * C, row-major, op = transpose when trans_*.
// lda/ldb/ldc are row strides (elements), so strided sub-matrices (one head of a (B,T,3C)
// buffer) can be used directly.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
          const T* B, int ldb, T beta, T* C, int ldc);

// out (N, OC) = inp (N, C) · weight (OC, C)^T + bias (OC). bias may be null.
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);

// dinp (N, C) = dout (N, OC) · weight (OC, C); dweight (OC, C) += dout^T · inp;
// dbias (OC) += Σ_n dout. dinp and dbias may be null.
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC);

// LayerNorm over the last dimension with eps = 1e-5 (GPT-2's value).
// out (N, C); mean, rstd (N) are saved for backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=.
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int N, int C);

// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).
template <class T>
void gelu_forward(T* out, const T* inp, size_t n);
// dinp (n) = gelu'(inp) * dout.
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n);

// Causal multi-head self-attention core.
// qkv (B, S, 3, NH, HS): per position, all heads' queries, then keys, then values (this rank's
// heads only under tensor parallelism). out (B, S, NH, HS). att (B, NH, S, S): softmax
// probabilities saved for backward (entries above the diagonal are written as 0).
// Scores are scaled by 1/√HS.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int S, int NH, int HS);
// dqkv (B, S, 3, NH, HS) = gradients for q, k, v. scratch: (S, S) per OpenMP thread, i.e.
// attention_scratch_elems(S) elements, owned by the caller.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, T* scratch, int B,
                        int S, int NH, int HS);
size_t attention_scratch_elems(int S);

// out (B, S, C) = wte[tokens[b,s] - vocab_start] + wpe[s] for tokens in
// [vocab_start, vocab_start + V_local); tokens outside this shard contribute 0 from wte (the
// vocab-parallel embedding: shards are summed across the tensor group). wpe may be null.
// wte (V_local, C), wpe (S_max, C) with S ≤ S_max.
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int S,
                       int C, int vocab_start, int V_local);
// dwte += scatter of dout by token (own shard only), dwpe (S, C) += Σ_b dout. dwpe may be null.
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int S,
                        int C, int vocab_start, int V_local);

// Vocab-parallel cross-entropy, in the steps Megatron-LM's takes so that no rank ever holds the
// full logits. logits (N, ld) hold this rank's vocabulary columns [vocab_start, vocab_start + ld)
// of which the first `valid` are real tokens (the rest is padding, excluded everywhere).
//   1. row_max (N)   = max over valid columns                  (then all-reduce max)
//   2. row_sumexp (N) = Σ exp(logit - row_max)                  (then all-reduce sum)
//   3. target_logit (N) = logit[target] if target is in this shard, else 0 (then all-reduce sum)
//   loss_n = log(row_sumexp) + row_max - target_logit
// Steps 1 and 2 may also run on the shard alone, with its own max (one read of the logits, as the
// GPU does); ce_rescale_sumexp then brings each shard's sum to the group's max before the sum:
//   row_sumexp (N) *= exp(local_max - row_max)
// ce_backward: dlogits (N, ld) = scale * (softmax - onehot(target)), 0 on padding columns
// (assigned, not accumulated: logits gradients have one producer).
template <class T>
void ce_row_max(T* row_max, const T* logits, int N, int ld, int valid);
template <class T>
void ce_row_sumexp(T* row_sumexp, const T* logits, const T* row_max, int N, int ld, int valid);
template <class T>
void ce_rescale_sumexp(T* row_sumexp, const T* local_max, const T* row_max, int N);
template <class T>
void ce_target_logit(T* target_logit, const T* logits, const int32_t* targets, int N, int ld,
                     int vocab_start, int valid);
template <class T>
void ce_losses(T* losses, const T* row_max, const T* row_sumexp, const T* target_logit, int N);
template <class T>
void ce_backward(T* dlogits, const T* logits, const T* row_max, const T* row_sumexp,
                 const int32_t* targets, T scale, int N, int ld, int vocab_start, int valid);

// y (n) += x (n)
template <class T>
void add_inplace(T* y, const T* x, size_t n);
// out (n) = a + b
template <class T>
void add(T* out, const T* a, const T* b, size_t n);
// y (n) *= s
template <class T>
void scale_inplace(T* y, T s, size_t n);
// Σ x², accumulated in double.
template <class T>
double sum_squares(const T* x, size_t n);

// One AdamW step on n parameters (decoupled weight decay, bias-corrected moments).
// step is 1-based; weight_decay is applied as param -= lr * wd * param. Each gradient is
// multiplied by grad_scale as it is read (the clipping coefficient; the gradients stay as they
// are).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale);

}  // namespace strata::kernels::cpu
