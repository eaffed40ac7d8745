// rmsnorm.h — CPU RMSNorm over the last dimension (Llama's norm): pure functions on raw row-major
// buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// rmsnorm_backward ACCUMULATES (+=) into the parameter gradient dweight, so it sums over
// micro-batches, and into the input gradient dinp, the residual stream's, which sums over its
// branches (as layernorm_backward does). The CUDA backend's RMSNorm is tested against these.
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

}  // namespace strata::kernels::cpu
