// cross_entropy.cc — CPU implementation of kernels/cpu/cross_entropy.h.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

template <class T>
void ce_row_max(T* row_max, const T* logits, int N, int ld, int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + static_cast<size_t>(n) * ld;  // (ld), first `valid` real
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
    row_max[n] = mx;
  }
}

template <class T>
void ce_row_sumexp(T* row_sumexp, const T* logits, const T* row_max, int N, int ld, int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + static_cast<size_t>(n) * ld;  // (ld)
    const T mx = row_max[n];
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < valid; ++j) sum += exp_t(row[j] - mx);
    row_sumexp[n] = sum;
  }
}

template <class T>
void ce_rescale_sumexp(T* row_sumexp, const T* local_max, const T* row_max, int N) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) row_sumexp[n] *= exp_t(local_max[n] - row_max[n]);
}

template <class T>
void ce_target_logit(T* target_logit, const T* logits, const int32_t* targets, int N, int ld,
                     int vocab_start, int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const int32_t local = targets[n] - vocab_start;
    const bool own = local >= 0 && local < valid;
    target_logit[n] = own ? logits[static_cast<size_t>(n) * ld + local] : T(0);
  }
}

template <class T>
void ce_losses(T* losses, const T* row_max, const T* row_sumexp, const T* target_logit,
               const T* weights, int N) {
  if (weights == nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) losses[n] = std::log(row_sumexp[n]) + row_max[n] - target_logit[n];
    return;
  }
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    // Tested, not multiplied: 0 · NaN (a masked row's NaN or inf logits) would be NaN.
    const T w = weights[n];
    losses[n] = w == T(0) ? T(0) : w * (std::log(row_sumexp[n]) + row_max[n] - target_logit[n]);
  }
}

template <class T>
void ce_backward(T* dlogits, const T* logits, const T* row_max, const T* row_sumexp,
                 const int32_t* targets, const T* weights, T scale, int N, int ld, int vocab_start,
                 int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + static_cast<size_t>(n) * ld;  // (ld)
    T* drow = dlogits + static_cast<size_t>(n) * ld;      // (ld)
    if (weights != nullptr && weights[n] == T(0)) {
      // A masked row: exact zeros, its logits never read (they may be NaN or inf).
      std::fill(drow, drow + ld, T(0));
      continue;
    }
    // Without weights the row's factor is `scale` itself: the unweighted arithmetic.
    const T s = weights != nullptr ? weights[n] * scale : scale;
    const T mx = row_max[n];
    const T inv = T(1) / row_sumexp[n];
    const int32_t local = targets[n] - vocab_start;
#pragma omp simd
    for (int j = 0; j < valid; ++j) drow[j] = s * (exp_t(row[j] - mx) * inv);
    // The one-hot term outside the loop, which a per-column test would keep from vectorising.
    if (local >= 0 && local < valid) drow[local] = s * (exp_t(row[local] - mx) * inv - T(1));
    for (int j = valid; j < ld; ++j) drow[j] = T(0);
  }
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_CROSS_ENTROPY(T)                                                    \
  template void ce_row_max<T>(T*, const T*, int, int, int);                                        \
  template void ce_row_sumexp<T>(T*, const T*, const T*, int, int, int);                           \
  template void ce_rescale_sumexp<T>(T*, const T*, const T*, int);                                 \
  template void ce_target_logit<T>(T*, const T*, const int32_t*, int, int, int, int);              \
  template void ce_losses<T>(T*, const T*, const T*, const T*, const T*, int);                     \
  template void ce_backward<T>(T*, const T*, const T*, const T*, const int32_t*, const T*, T, int, \
                               int, int, int);

STRATA_INSTANTIATE_CPU_CROSS_ENTROPY(float)
STRATA_INSTANTIATE_CPU_CROSS_ENTROPY(double)

#undef STRATA_INSTANTIATE_CPU_CROSS_ENTROPY

}  // namespace strata::kernels::cpu
