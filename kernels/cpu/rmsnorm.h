// rmsnorm.h — CPU RMSNorm over the last dimension (Llama's norm), and over each query and key head
// of the attention's q/k/v (Qwen3's q_norm and k_norm): pure functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// rmsnorm_backward ACCUMULATES (+=) into the parameter gradient dweight, so it sums over
// micro-batches, and into the input gradient dinp, the residual stream's, which sums over its
// branches (as layernorm_backward does). qk_rmsnorm_backward accumulates into its weight
// gradients too, but ASSIGNS its input gradient, in place over the incoming one (the q/k/v's
// gradient has one producer). The CUDA backend's RMSNorms are tested against these.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

namespace strata::kernels::cpu {

// out (N, C) = inp · rstd · weight; rstd (N) = 1/√(mean(inp²) + eps), saved for backward.
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps);
// dinp (N, C) +=, dweight (C) +=.
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int N, int C);

// qkv (N, NH + 2·KVH, HS), N positions in the attention layout (runtime/backend/backend.h: per
// position NH query heads, then KVH key heads, then KVH value heads), in place: each query head
// x ← x · rstd · q_weight, each key head x ← x · rstd · k_weight, rstd = 1/√(mean(x²) + eps)
// over the head's HS values; the value heads are left untouched. rstd (N, NH + KVH): per position
// its query heads' then its key heads'. q_weight, k_weight (HS).
template <class T>
void qk_rmsnorm_forward(T* qkv, T* rstd, const T* q_weight, const T* k_weight, int N, int NH,
                        int KVH, int HS, T eps);
// dqkv (N, NH + 2·KVH, HS), in place: on entry the gradient of the normalised q/k/v, on return
// its query and key heads hold the gradient of the pre-norm x (assigned); the value heads are
// left untouched. dq_weight, dk_weight (HS) +=. x (N, NH + 2·KVH, HS) the pre-norm q/k/v (value
// heads not read), rstd (N, NH + KVH) the forward's.
template <class T>
void qk_rmsnorm_backward(T* dqkv, T* dq_weight, T* dk_weight, const T* x, const T* q_weight,
                         const T* k_weight, const T* rstd, int N, int NH, int KVH, int HS);

}  // namespace strata::kernels::cpu
