// attention_block.cc — CPU implementation of kernels/cpu/attention_block.h.
//
// One (batch, key/value head) pair per OpenMP iteration, so the query heads sharing a key/value
// head accumulate into its gradient on one thread; the GEMMs inside run single-threaded (Debian's
// OpenMP OpenBLAS inside a parallel region), as in attention.cc.
#include "kernels/cpu/attention_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace strata::kernels::cpu {

namespace {

// The keys query row i sees: [0, keys(i)).
int visible(BlockMask mask, int i, int Sk) {
  return mask == BlockMask::kCausal ? std::min(i + 1, Sk) : Sk;
}

}  // namespace

template <class T>
void attention_block_forward(T* out, T* lse, const T* q, const T* kv, int B, int Sq, int Sk, int NH,
                             int KVH, int HS, BlockMask mask) {
  const int group = NH / KVH, ldq = NH * HS, ldkv = 2 * KVH * HS;
  const T scale = T(1) / std::sqrt(T(HS));
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(Sq) * Sk);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH, g = h / group;
      const T* qh = q + static_cast<size_t>(b) * Sq * ldq + static_cast<size_t>(h) * HS;
      const T* kh = kv + static_cast<size_t>(b) * Sk * ldkv + static_cast<size_t>(g) * HS;
      const T* vh = kh + static_cast<size_t>(KVH) * HS;
      T* oh = out + static_cast<size_t>(b) * Sq * ldq + static_cast<size_t>(h) * HS;
      T* lh = lse + static_cast<size_t>(bh) * Sq;
      // Scores (Sq, Sk), then each row's softmax over the keys it sees, then P · v.
      if (Sq > 0 && Sk > 0)
        gemm<T>(false, true, Sq, Sk, HS, scale, qh, ldq, kh, ldkv, T(0), s.data(), Sk);
      for (int i = 0; i < Sq; ++i) {
        T* row = s.data() + static_cast<size_t>(i) * Sk;
        const int n = visible(mask, i, Sk);
        if (n == 0) {
          std::fill(row, row + Sk, T(0));
          lh[i] = neg_inf;
          continue;
        }
        const T mx = *std::max_element(row, row + n);
        T sum = 0;
        for (int j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
        for (int j = 0; j < n; ++j) row[j] /= sum;
        std::fill(row + n, row + Sk, T(0));
        lh[i] = mx + std::log(sum);
      }
      if (Sq > 0 && Sk > 0)
        gemm<T>(false, false, Sq, HS, Sk, T(1), s.data(), Sk, vh, ldkv, T(0), oh, ldq);
    }
  }
}

template <class T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int B, int Sq, int NH,
                     int HS) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    for (int i = 0; i < Sq; ++i) {
      T& la = lse[static_cast<size_t>(bh) * Sq + i];
      const T lb = lse_b[static_cast<size_t>(bh) * Sq + i];
      T* oa = out + (static_cast<size_t>(b) * Sq + i) * NH * HS + static_cast<size_t>(h) * HS;
      const T* ob =
          out_b + (static_cast<size_t>(b) * Sq + i) * NH * HS + static_cast<size_t>(h) * HS;
      if (lb == neg_inf) continue;  // the block saw no key of this row
      if (la == neg_inf) {
        std::copy(ob, ob + HS, oa);
        la = lb;
        continue;
      }
      const T m = std::max(la, lb);
      const T l = m + std::log(std::exp(la - m) + std::exp(lb - m));
      const T wa = std::exp(la - l), wb = std::exp(lb - l);
      for (int d = 0; d < HS; ++d) oa[d] = wa * oa[d] + wb * ob[d];
      la = l;
    }
  }
}

template <class T>
void attention_block_delta(T* delta, const T* dout, const T* out, int B, int Sq, int NH, int HS) {
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    for (int i = 0; i < Sq; ++i) {
      const size_t at = (static_cast<size_t>(b) * Sq + i) * NH * HS + static_cast<size_t>(h) * HS;
      T d = 0;
      for (int k = 0; k < HS; ++k) d += dout[at + k] * out[at + k];
      delta[static_cast<size_t>(bh) * Sq + i] = d;
    }
  }
}

template <class T>
void attention_block_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* lse,
                              const T* delta, int B, int Sq, int Sk, int NH, int KVH, int HS,
                              BlockMask mask) {
  if (Sq == 0 || Sk == 0) return;
  const int group = NH / KVH, ldq = NH * HS, ldkv = 2 * KVH * HS;
  const T scale = T(1) / std::sqrt(T(HS));
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel
  {
    std::vector<T> p(static_cast<size_t>(Sq) * Sk), dp(static_cast<size_t>(Sq) * Sk);
#pragma omp for schedule(static)
    for (int bg = 0; bg < B * KVH; ++bg) {
      const int b = bg / KVH, g = bg % KVH;
      const T* kh = kv + static_cast<size_t>(b) * Sk * ldkv + static_cast<size_t>(g) * HS;
      const T* vh = kh + static_cast<size_t>(KVH) * HS;
      T* dkh = dkv + static_cast<size_t>(b) * Sk * ldkv + static_cast<size_t>(g) * HS;
      T* dvh = dkh + static_cast<size_t>(KVH) * HS;
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const size_t bh = static_cast<size_t>(b) * NH + h;
        const size_t qoff = static_cast<size_t>(b) * Sq * ldq + static_cast<size_t>(h) * HS;
        const T* qh = q + qoff;
        const T* doh = dout + qoff;
        T* dqh = dq + qoff;
        // P = exp(s − lse) of the merged row (0 for keys the row does not see).
        gemm<T>(false, true, Sq, Sk, HS, scale, qh, ldq, kh, ldkv, T(0), p.data(), Sk);
        // dP = dout · vᵀ
        gemm<T>(false, true, Sq, Sk, HS, T(1), doh, ldq, vh, ldkv, T(0), dp.data(), Sk);
        for (int i = 0; i < Sq; ++i) {
          T* pr = p.data() + static_cast<size_t>(i) * Sk;
          T* dr = dp.data() + static_cast<size_t>(i) * Sk;
          const int n = visible(mask, i, Sk);
          const T l = lse[bh * Sq + i], d = delta[bh * Sq + i];
          for (int j = 0; j < Sk; ++j) {
            const bool seen = j < n && l != neg_inf;
            pr[j] = seen ? std::exp(pr[j] - l) : T(0);
            dr[j] = pr[j] * (dr[j] - d);  // dS
          }
        }
        // dq += dS · k / √HS;  dk += dSᵀ · q / √HS;  dv += Pᵀ · dout.
        gemm<T>(false, false, Sq, HS, Sk, scale, dp.data(), Sk, kh, ldkv, T(1), dqh, ldq);
        gemm<T>(true, false, Sk, HS, Sq, scale, dp.data(), Sk, qh, ldq, T(1), dkh, ldkv);
        gemm<T>(true, false, Sk, HS, Sq, T(1), p.data(), Sk, doh, ldq, T(1), dvh, ldkv);
      }
    }
  }
}

#define STRATA_INSTANTIATE(T)                                                                   \
  template void attention_block_forward<T>(T*, T*, const T*, const T*, int, int, int, int, int, \
                                           int, BlockMask);                                     \
  template void attention_merge<T>(T*, T*, const T*, const T*, int, int, int, int);             \
  template void attention_block_delta<T>(T*, const T*, const T*, int, int, int, int);           \
  template void attention_block_backward<T>(T*, T*, const T*, const T*, const T*, const T*,     \
                                            const T*, int, int, int, int, int, int, BlockMask);
STRATA_INSTANTIATE(float)
STRATA_INSTANTIATE(double)
#undef STRATA_INSTANTIATE

}  // namespace strata::kernels::cpu
