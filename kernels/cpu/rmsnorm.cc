// rmsnorm.cc — CPU implementation of kernels/cpu/rmsnorm.h.
//
// The sum of squares is accumulated in T, float included: its terms are all ≥ 0, so nothing
// cancels and the relative error stays ~√C·ε in practice (C·ε at worst), far below the bf16
// rounding the activations see in mixed precision; a double accumulator would halve the vector
// width for no visible gain. The weight gradients are summed over the rows in parallel over
// column chunks (see kernels/cpu/util.h): the same order whatever the thread count.
#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

namespace {

// One row of C: y = x · s · w with s = 1/√(mean(x²) + eps), returned; y may be x (in place: each
// element is read before it is written).
template <class T>
T rms_row_forward(T* y, const T* x, const T* w, int C, T eps) {
  T ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < C; ++i) ss += x[i] * x[i];
  const T s = T(1) / std::sqrt(ss / C + eps);
#pragma omp simd
  for (int i = 0; i < C; ++i) y[i] = x[i] * s * w[i];
  return s;
}

// One row's input gradient, added into dx (kAccumulate) or assigned to it; with s the row's rstd,
// xhat = x · s and g = w · dy, and ∂s/∂x_i = −s³·x_i / C:
// dx = s · (g − xhat · mean(g · xhat)). When assigned, dx may be dy (in place: dy is read whole
// for the mean first, then each element before it is written).
template <bool kAccumulate, class T>
void rms_row_backward(T* dx, const T* dy, const T* x, const T* w, T s, int C) {
  T g_xhat_mean = 0;
#pragma omp simd reduction(+ : g_xhat_mean)
  for (int i = 0; i < C; ++i) g_xhat_mean += w[i] * dy[i] * x[i] * s;
  g_xhat_mean /= C;
#pragma omp simd
  for (int i = 0; i < C; ++i) {
    const T xhat = x[i] * s;
    const T d = (w[i] * dy[i] - xhat * g_xhat_mean) * s;
    if constexpr (kAccumulate) {
      dx[i] += d;
    } else {
      dx[i] = d;
    }
  }
}

}  // namespace

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * C;
    rstd[n] = rms_row_forward(out + row, inp + row, weight, C, eps);
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int N, int C) {
  // dinp: rows are independent, so parallel over rows.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * C;
    rms_row_backward<true>(dinp + row, dout + row, inp + row, weight, rstd[n], C);
  }
  // dweight: a sum over rows, parallel over column chunks (see the file comment).
  for_column_chunks(C, [&](int c0, int c1) {
    T dw[kColumnChunk] = {};  // (c1 - c0)
    for (int n = 0; n < N; ++n) {
      const T* x = inp + static_cast<size_t>(n) * C;    // (C)
      const T* dy = dout + static_cast<size_t>(n) * C;  // (C)
      const T s = rstd[n];
      for (int i = c0; i < c1; ++i) dw[i - c0] += x[i] * s * dy[i];
    }
    for (int i = c0; i < c1; ++i) dweight[i] += dw[i - c0];
  });
}

// The query and key heads are rows of HS: head j < NH + KVH of position n starts at
// (n·(NH + 2·KVH) + j)·HS, its statistic is rstd[n·(NH + KVH) + j], its weight q_weight for j < NH
// and k_weight after.

template <class T>
void qk_rmsnorm_forward(T* qkv, T* rstd, const T* q_weight, const T* k_weight, int N, int NH,
                        int KVH, int HS, T eps) {
  const int heads = NH + KVH, width = (NH + 2 * KVH) * HS;
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < heads; ++j) {
      T* x = qkv + static_cast<size_t>(n) * width + static_cast<size_t>(j) * HS;  // (HS)
      rstd[static_cast<size_t>(n) * heads + j] =
          rms_row_forward(x, x, j < NH ? q_weight : k_weight, HS, eps);
    }
  }
}

template <class T>
void qk_rmsnorm_backward(T* dqkv, T* dq_weight, T* dk_weight, const T* x, const T* q_weight,
                         const T* k_weight, const T* rstd, int N, int NH, int KVH, int HS) {
  const int heads = NH + KVH, width = (NH + 2 * KVH) * HS;
  // The weight gradients first: they read the incoming gradient that the rows then overwrite.
  // Sums over the positions and heads, parallel over column chunks (see the file comment).
  for_column_chunks(HS, [&](int c0, int c1) {
    T dq[kColumnChunk] = {}, dk[kColumnChunk] = {};  // (c1 - c0)
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < heads; ++j) {
        const size_t at = static_cast<size_t>(n) * width + static_cast<size_t>(j) * HS;
        const T* xr = x + at;     // (HS)
        const T* dy = dqkv + at;  // (HS)
        const T s = rstd[static_cast<size_t>(n) * heads + j];
        T* dw = j < NH ? dq : dk;  // (c1 - c0)
        for (int i = c0; i < c1; ++i) dw[i - c0] += xr[i] * s * dy[i];
      }
    }
    for (int i = c0; i < c1; ++i) {
      dq_weight[i] += dq[i - c0];
      dk_weight[i] += dk[i - c0];
    }
  });
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < heads; ++j) {
      const size_t at = static_cast<size_t>(n) * width + static_cast<size_t>(j) * HS;
      rms_row_backward<false>(dqkv + at, dqkv + at, x + at, j < NH ? q_weight : k_weight,
                              rstd[static_cast<size_t>(n) * heads + j], HS);
    }
  }
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_RMSNORM(T)                                                       \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, T);                    \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);  \
  template void qk_rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, int, int, T);       \
  template void qk_rmsnorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, int, \
                                       int, int, int);

STRATA_INSTANTIATE_CPU_RMSNORM(float)
STRATA_INSTANTIATE_CPU_RMSNORM(double)

#undef STRATA_INSTANTIATE_CPU_RMSNORM

}  // namespace strata::kernels::cpu
