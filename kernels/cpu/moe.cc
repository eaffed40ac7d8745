// moe.cc — CPU implementation of kernels/cpu/moe.h.
//
// Rows (tokens) are independent in every op but the dispatch plan, so those run in parallel over
// rows with each row's sums in a fixed order. The plan is one sequential pass over the N·k
// assignments (plus a sort of each overflowing expert's assignments when a capacity drops some):
// its layout depends on every earlier assignment, and the pass is a few ns per assignment.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

template <class T>
void moe_route(T* probs, int32_t* topk_idx, T* topk_w, const T* logits, int64_t N, int E, int k,
               bool renormalize) {
#pragma omp parallel
  {
    std::vector<char> taken(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = logits + n * E;  // (E)
      T* p = probs + n * E;         // (E)
      T mx = x[0];
      for (int e = 1; e < E; ++e) mx = std::max(mx, x[e]);
      T sum = 0;
      for (int e = 0; e < E; ++e) {
        p[e] = std::exp(x[e] - mx);
        sum += p[e];
      }
      for (int e = 0; e < E; ++e) p[e] /= sum;
      // k passes of an argmax over the experts not yet taken; a strict > keeps the lower index
      // among equal probabilities.
      std::fill(taken.begin(), taken.end(), 0);
      int32_t* idx = topk_idx + n * k;  // (k)
      T* w = topk_w + n * k;            // (k)
      T selected = 0;
      for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < E; ++e)
          if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        idx[j] = best;
        w[j] = p[best];
        selected += p[best];
      }
      if (renormalize)
        for (int j = 0; j < k; ++j) w[j] /= selected;
    }
  }
}

// Per row, with p the probabilities and S the selected experts: w_j = p_j / s, s = Σ_S p, so
// ∂L/∂p_j = (dw_j − Σ_i dw_i·w_i) / s for j ∈ S (dw_j without renormalisation), 0 elsewhere, plus
// dprobs_expert; then the softmax: dlogit = p ⊙ (dp − Σ_e p_e·dp_e).
template <class T>
void moe_route_backward(T* dlogits, const T* dtopk_w, const T* dprobs_expert, const T* probs,
                        const int32_t* topk_idx, int64_t N, int E, int k, bool renormalize) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* p = probs + n * E;             // (E)
    const int32_t* idx = topk_idx + n * k;  // (k)
    const T* dw = dtopk_w + n * k;          // (k)
    T* dp = dlogits + n * E;                // (E): dp first, then dlogits in place
    for (int e = 0; e < E; ++e) dp[e] = dprobs_expert ? dprobs_expert[e] : T(0);
    if (renormalize) {
      T s = 0, dw_w = 0;
      for (int j = 0; j < k; ++j) s += p[idx[j]];
      for (int j = 0; j < k; ++j) dw_w += dw[j] * (p[idx[j]] / s);
      for (int j = 0; j < k; ++j) dp[idx[j]] += (dw[j] - dw_w) / s;
    } else {
      for (int j = 0; j < k; ++j) dp[idx[j]] += dw[j];
    }
    T dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
  }
}

void moe_dispatch_plan(int32_t* dest_row, int32_t* counts, int32_t* routed, const int32_t* topk_idx,
                       const float* topk_w, int64_t N, int k, int E, int64_t capacity) {
  const int64_t A = N * k;  // assignments
  std::fill(routed, routed + E, 0);
  for (int64_t a = 0; a < A; ++a) ++routed[topk_idx[a]];
  // Which assignments of an overflowing expert stay: its `capacity` largest weights, equal
  // weights by the lower flat index (the lower token: a token names an expert at most once).
  std::vector<char> dropped(static_cast<size_t>(A), 0);
  bool overflow = false;
  for (int e = 0; e < E; ++e) {
    counts[e] =
        capacity < 0 ? routed[e] : static_cast<int32_t>(std::min<int64_t>(routed[e], capacity));
    overflow = overflow || counts[e] < routed[e];
  }
  if (overflow) {
    std::vector<std::vector<int64_t>> of(static_cast<size_t>(E));  // assignments per expert
    for (int64_t a = 0; a < A; ++a)
      if (counts[topk_idx[a]] < routed[topk_idx[a]]) of[topk_idx[a]].push_back(a);
    for (int e = 0; e < E; ++e) {
      std::vector<int64_t>& list = of[e];
      if (list.empty()) continue;
      std::sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
        return topk_w[a] > topk_w[b] || (topk_w[a] == topk_w[b] && a < b);
      });
      for (size_t i = static_cast<size_t>(counts[e]); i < list.size(); ++i) dropped[list[i]] = 1;
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(E));  // the next row of each expert
  int64_t offset = 0;
  for (int e = 0; e < E; ++e) {
    next[e] = offset;
    offset += counts[e];
  }
  for (int64_t a = 0; a < A; ++a)
    dest_row[a] = dropped[a] ? -1 : static_cast<int32_t>(next[topk_idx[a]]++);
}

void moe_permute(void* xp, const void* x, size_t elem_bytes, const int32_t* dest_row, int64_t N,
                 int k, int64_t C) {
  const size_t row = static_cast<size_t>(C) * elem_bytes;
  char* to = static_cast<char*>(xp);
  const char* from = static_cast<const char*>(x);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      const int32_t d = dest_row[n * k + j];
      if (d >= 0) std::memcpy(to + static_cast<size_t>(d) * row, from + n * row, row);
    }
}

template <class T>
void moe_permute_backward(T* dx, const T* dxp, const int32_t* dest_row, int64_t N, int k,
                          int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* o = dx + n * C;  // (C)
    std::fill(o, o + C, T(0));
    for (int j = 0; j < k; ++j) {
      const int32_t d = dest_row[n * k + j];
      if (d < 0) continue;
      const T* g = dxp + static_cast<int64_t>(d) * C;  // (C)
      for (int64_t c = 0; c < C; ++c) o[c] += g[c];
    }
  }
}

template <class T>
void moe_unpermute(T* out, const T* y, const int32_t* dest_row, const T* topk_w, int64_t N, int k,
                   int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;  // (C)
    std::fill(o, o + C, T(0));
    for (int j = 0; j < k; ++j) {
      const int32_t d = dest_row[n * k + j];
      if (d < 0) continue;
      const T w = topk_w[n * k + j];
      const T* r = y + static_cast<int64_t>(d) * C;  // (C)
      for (int64_t c = 0; c < C; ++c) o[c] += w * r[c];
    }
  }
}

template <class T>
void moe_unpermute_backward(T* dy, T* dtopk_w, const T* dout, const T* y, const int32_t* dest_row,
                            const T* topk_w, int64_t N, int k, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dout + n * C;  // (C)
    for (int j = 0; j < k; ++j) {
      const int32_t d = dest_row[n * k + j];
      if (d < 0) {
        dtopk_w[n * k + j] = 0;
        continue;
      }
      const T w = topk_w[n * k + j];
      const T* r = y + static_cast<int64_t>(d) * C;  // (C)
      T* o = dy + static_cast<int64_t>(d) * C;       // (C)
      T dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dot += g[c] * r[c];
        o[c] = w * g[c];
      }
      dtopk_w[n * k + j] = dot;
    }
  }
}

void moe_prob_sums(float* sums, const float* probs, int64_t N, int E) {
  for_column_chunks(E, [&](int e0, int e1) {
    double s[kColumnChunk] = {};  // (e1 - e0)
    for (int64_t n = 0; n < N; ++n) {
      const float* p = probs + n * E;  // (E)
      for (int e = e0; e < e1; ++e) s[e - e0] += p[e];
    }
    for (int e = e0; e < e1; ++e) sums[e] = static_cast<float>(s[e - e0]);
  });
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_MOE(T)                                                            \
  template void moe_route<T>(T*, int32_t*, T*, const T*, int64_t, int, int, bool);               \
  template void moe_route_backward<T>(T*, const T*, const T*, const T*, const int32_t*, int64_t, \
                                      int, int, bool);                                           \
  template void moe_permute_backward<T>(T*, const T*, const int32_t*, int64_t, int, int64_t);    \
  template void moe_unpermute<T>(T*, const T*, const int32_t*, const T*, int64_t, int, int64_t); \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*,  \
                                          int64_t, int, int64_t);

STRATA_INSTANTIATE_CPU_MOE(float)
STRATA_INSTANTIATE_CPU_MOE(double)

#undef STRATA_INSTANTIATE_CPU_MOE

}  // namespace strata::kernels::cpu
