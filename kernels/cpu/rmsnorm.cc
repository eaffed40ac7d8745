// rmsnorm.cc — CPU implementation of kernels/cpu/rmsnorm.h.
//
// The sum of squares is accumulated in T, float included: its terms are all ≥ 0, so nothing
// cancels and the relative error stays ~√C·ε in practice (C·ε at worst), far below the bf16
// rounding the activations see in mixed precision; a double accumulator would halve the vector
// width for no visible gain. dweight is summed over the rows in parallel over column chunks (see
// kernels/cpu/util.h): the same order whatever the thread count.
#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;  // (C)
    T* y = out + static_cast<size_t>(n) * C;        // (C)
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < C; ++i) ss += x[i] * x[i];
    const T s = T(1) / std::sqrt(ss / C + eps);
#pragma omp simd
    for (int i = 0; i < C; ++i) y[i] = x[i] * s * weight[i];
    rstd[n] = s;
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int N, int C) {
  // dinp: rows are independent, so parallel over rows.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;    // (C)
    const T* dy = dout + static_cast<size_t>(n) * C;  // (C)
    T* dx = dinp + static_cast<size_t>(n) * C;        // (C)
    const T s = rstd[n];
    // With xhat = x · rstd and g = weight · dout, and ∂rstd/∂x_i = −rstd³·x_i / C:
    // dx = rstd · (g − xhat · mean(g · xhat)).
    T g_xhat_mean = 0;
#pragma omp simd reduction(+ : g_xhat_mean)
    for (int i = 0; i < C; ++i) g_xhat_mean += weight[i] * dy[i] * x[i] * s;
    g_xhat_mean /= C;
#pragma omp simd
    for (int i = 0; i < C; ++i) {
      const T xhat = x[i] * s;
      dx[i] += (weight[i] * dy[i] - xhat * g_xhat_mean) * s;
    }
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

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_RMSNORM(T)                                    \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, T); \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);

STRATA_INSTANTIATE_CPU_RMSNORM(float)
STRATA_INSTANTIATE_CPU_RMSNORM(double)

#undef STRATA_INSTANTIATE_CPU_RMSNORM

}  // namespace strata::kernels::cpu
