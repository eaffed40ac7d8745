// layernorm.cc — CPU implementation of kernels/cpu/layernorm.h.
//
// dweight and dbias are summed over the rows in parallel over column chunks (see
// kernels/cpu/util.h): the same order whatever the thread count.
#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, double eps_d) {
  const T eps = T(eps_d);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;  // (C)
    T* y = out + static_cast<size_t>(n) * C;        // (C)
    // omp simd lets the sums be reassociated into vector lanes (deterministic for a given build).
    T m = 0;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; ++i) m += x[i];
    m /= C;
    // Two passes (mean, then squared deviations) instead of E[x²] - E[x]², which cancels
    // catastrophically in float when |mean| >> std.
    T var = 0;
#pragma omp simd reduction(+ : var)
    for (int i = 0; i < C; ++i) {
      const T d = x[i] - m;
      var += d * d;
    }
    var /= C;
    const T s = T(1) / std::sqrt(var + eps);
    for (int i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C) {
  // dinp: rows are independent, so parallel over rows.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;    // (C)
    const T* dy = dout + static_cast<size_t>(n) * C;  // (C)
    T* dx = dinp + static_cast<size_t>(n) * C;        // (C)
    const T m = mean[n];
    const T s = rstd[n];
    // With xhat = (x - mean) * rstd and g = weight * dout:
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    T g_mean = 0;
    T g_xhat_mean = 0;
#pragma omp simd reduction(+ : g_mean, g_xhat_mean)
    for (int i = 0; i < C; ++i) {
      const T xhat = (x[i] - m) * s;
      const T g = weight[i] * dy[i];
      g_mean += g;
      g_xhat_mean += g * xhat;
    }
    g_mean /= C;
    g_xhat_mean /= C;
    for (int i = 0; i < C; ++i) {
      const T xhat = (x[i] - m) * s;
      const T g = weight[i] * dy[i];
      dx[i] += (g - g_mean - xhat * g_xhat_mean) * s;
    }
  }
  // dweight, dbias: sums over rows, parallel over column chunks (see the file comment).
  for_column_chunks(C, [&](int c0, int c1) {
    T dw[kColumnChunk] = {};  // (c1 - c0)
    T db[kColumnChunk] = {};  // (c1 - c0)
    for (int n = 0; n < N; ++n) {
      const T* x = inp + static_cast<size_t>(n) * C;    // (C)
      const T* dy = dout + static_cast<size_t>(n) * C;  // (C)
      const T m = mean[n];
      const T s = rstd[n];
      for (int i = c0; i < c1; ++i) {
        dw[i - c0] += (x[i] - m) * s * dy[i];
        db[i - c0] += dy[i];
      }
    }
    for (int i = c0; i < c1; ++i) {
      dweight[i] += dw[i - c0];
      dbias[i] += db[i - c0];
    }
  });
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_LAYERNORM(T)                                                       \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, double); \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,         \
                                      const T*, int, int);

STRATA_INSTANTIATE_CPU_LAYERNORM(float)
STRATA_INSTANTIATE_CPU_LAYERNORM(double)

#undef STRATA_INSTANTIATE_CPU_LAYERNORM

}  // namespace strata::kernels::cpu
