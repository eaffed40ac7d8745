// gemm.cc — CPU implementation of kernels/cpu/gemm.h.
//
// GEMMs go to OpenBLAS (blas.h loads it). The build uses Debian's OpenMP-flavoured OpenBLAS, which
// runs a GEMM single-threaded when it is called inside an OpenMP parallel region; attention
// (attention.cc) relies on this to run one small single-threaded GEMM per (batch, head) pair on
// every thread at once. dbias is summed over the rows in parallel over column chunks (see
// kernels/cpu/util.h).
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

namespace {

void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  blas_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  blas_dgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc) {
  // BLAS rejects some degenerate shapes through its argument checks (lda < 1); an empty C has
  // nothing to compute.
  if (M <= 0 || N <= 0) return;
  blas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  // Pre-filling out with the bias and letting the GEMM accumulate (beta = 1) saves a second
  // pass over out.
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      T* row = out + static_cast<size_t>(n) * OC;  // (OC)
      for (int o = 0; o < OC; ++o) row[o] = bias[o];
    }
  }
  gemm<T>(false, true, N, OC, C, T(1), inp, C, weight, C, bias != nullptr ? T(1) : T(0), out, OC);
}

template <class T>
void matmul_backward_weight(T* dweight, T* dbias, const T* dout, const T* inp, int N, int C,
                            int OC) {
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C)
  gemm<T>(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias != nullptr) {
    // Row by row over a chunk of columns: dout is read in order (summing a column at a time
    // strides by OC and misses the cache on every element).
    for_column_chunks(OC, [&](int o0, int o1) {
      T acc[kColumnChunk] = {};  // (o1 - o0)
      for (int n = 0; n < N; ++n) {
        const T* row = dout + static_cast<size_t>(n) * OC;  // (OC)
        for (int o = o0; o < o1; ++o) acc[o - o0] += row[o];
      }
      for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
    });
  }
}

template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC) {
  if (dinp != nullptr) {
    // dinp (N, C) = dout (N, OC) · weight (OC, C)
    gemm<T>(false, false, N, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C);
  }
  matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_GEMM(T)                                                           \
  template void gemm<T>(bool, bool, int, int, int, T, const T*, int, const T*, int, T, T*, int); \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int);              \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);     \
  template void matmul_backward_weight<T>(T*, T*, const T*, const T*, int, int, int);

STRATA_INSTANTIATE_CPU_GEMM(float)
STRATA_INSTANTIATE_CPU_GEMM(double)

#undef STRATA_INSTANTIATE_CPU_GEMM

}  // namespace strata::kernels::cpu
