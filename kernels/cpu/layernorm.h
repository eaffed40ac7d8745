// layernorm.h — CPU LayerNorm over the last dimension: pure functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// layernorm_backward ACCUMULATES (+=) into the parameter gradients dweight and dbias, so they sum
// over micro-batches, and into the input gradient dinp, the residual stream's, which sums over its
// branches. The CUDA kernels: kernels/cuda/layernorm.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

namespace strata::kernels::cpu {

// LayerNorm over the last dimension, eps added to the variance (GPT-2's 1e-5, BERT's 1e-12).
// out (N, C); mean, rstd (N) are saved for backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, double eps = 1e-5);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=.
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C);

}  // namespace strata::kernels::cpu
