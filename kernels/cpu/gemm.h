// gemm.h — CPU GEMM and the linear layer on it: pure functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). The GEMM is OpenBLAS's
// (sgemm/dgemm); the bias loops use OpenMP. matmul_backward ACCUMULATES (+=) into the parameter
// gradients dweight and dbias, so they sum over micro-batches, and ASSIGNS the input gradient dinp
// (one producer), so its buffer needs no zeroing and is never read. Pointers documented as "may be
// null" skip that output. The CUDA side: cuBLASLt GEMMs in kernels/cuda/gemm_lt.h, the bias kernels
// in kernels/cuda/gemm_bias.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team and OpenBLAS's thread count as set by
// set_num_threads() (threads.h).
#pragma once

namespace strata::kernels::cpu {

// C (M, N) = alpha * op(A) * op(B) + beta * C, row-major, op = transpose when trans_*.
// lda/ldb/ldc are row strides (elements), so strided sub-matrices (one head of a (B,T,3C)
// buffer) can be used directly.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

// out (N, OC) = inp (N, C) · weight (OC, C)^T + bias (OC). bias may be null.
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);

// dinp (N, C) = dout (N, OC) · weight (OC, C); dweight (OC, C) += dout^T · inp;
// dbias (OC) += Σ_n dout. dinp and dbias may be null.
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC);

// The weight half of matmul_backward (the zero-bubble W pass): dweight (OC, C) += dout^T · inp;
// dbias (OC) += Σ_n dout, summed in the same order. dbias may be null.
template <class T>
void matmul_backward_weight(T* dweight, T* dbias, const T* dout, const T* inp, int N, int C,
                            int OC);

}  // namespace strata::kernels::cpu
