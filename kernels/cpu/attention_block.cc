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

// The keys query row i of sequence b sees: [0, visible(…)).
int visible(BlockMask mask, int i, int Sk, const BlockLayout& at, int b) {
  int n = mask == BlockMask::kCausal ? std::min(i + 1, Sk) : Sk;
  if (at.key_len) n = std::max(0, std::min(n, at.key_len[b]));
  return n;
}

// Causal blocks go by tiles of query rows, each against the keys up to its last row, so the
// masked half is never computed; other blocks are one tile.
constexpr int kCausalTile = 128;
int tile_rows(BlockMask mask, int Sq) {
  return mask == BlockMask::kCausal ? std::min(kCausalTile, std::max(Sq, 1)) : std::max(Sq, 1);
}

// The keys a tile of rows ending before row `end` sees at most: [0, tile_keys(…)).
int tile_keys(BlockMask mask, int end, int Sk, const BlockLayout& at, int b) {
  int n = mask == BlockMask::kCausal ? std::min(end, Sk) : Sk;
  if (at.key_len) n = std::max(0, std::min(n, at.key_len[b]));
  return n;
}

}  // namespace

BlockLayout dense_block_layout(int Sq, int Sk, int NH, int KVH, int HS) {
  BlockLayout at;
  at.q_ld = at.o_ld = int64_t{NH} * HS;
  at.q_batch = at.o_batch = at.q_ld * Sq;
  at.kv_ld = 2 * int64_t{KVH} * HS;
  at.kv_batch = at.kv_ld * Sk;
  at.lse_ld = Sq;
  return at;
}

template <class T>
void attention_block_forward(T* out, T* lse, const T* q, const T* kv, int B, int Sq, int Sk, int NH,
                             int KVH, int HS, BlockMask mask, const BlockLayout& at) {
  const int group = NH / KVH;
  const int ldq = static_cast<int>(at.q_ld), ldo = static_cast<int>(at.o_ld),
            ldkv = static_cast<int>(at.kv_ld);
  const T scale = T(1) / std::sqrt(T(HS));
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(tile_rows(mask, Sq)) * Sk);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH, g = h / group;
      const T* qh = q + b * at.q_batch + static_cast<int64_t>(h) * HS;
      const T* kh = kv + b * at.kv_batch + static_cast<int64_t>(g) * HS;
      const T* vh = kh + static_cast<int64_t>(KVH) * HS;
      T* oh = out + b * at.o_batch + static_cast<int64_t>(h) * HS;
      T* lh = lse + bh * at.lse_ld;
      // Per tile of query rows: scores against the keys the tile sees, each row's softmax over
      // its own, then P · v.
      for (int i0 = 0; i0 < Sq; i0 += tile_rows(mask, Sq)) {
        const int rows = std::min(tile_rows(mask, Sq), Sq - i0);
        const int kn = tile_keys(mask, i0 + rows, Sk, at, b);
        if (kn == 0) {  // no key for these rows: out 0, lse −inf
          for (int i = i0; i < i0 + rows; ++i) {
            std::fill(oh + static_cast<int64_t>(i) * ldo, oh + static_cast<int64_t>(i) * ldo + HS,
                      T(0));
            lh[i] = neg_inf;
          }
          continue;
        }
        gemm<T>(false, true, rows, kn, HS, scale, qh + static_cast<int64_t>(i0) * ldq, ldq, kh,
                ldkv, T(0), s.data(), kn);
        for (int i = 0; i < rows; ++i) {
          T* row = s.data() + static_cast<size_t>(i) * kn;
          const int n = visible(mask, i0 + i, Sk, at, b);
          if (n == 0) {
            std::fill(row, row + kn, T(0));
            lh[i0 + i] = neg_inf;
            continue;
          }
          const T mx = *std::max_element(row, row + n);
          T sum = 0;
          for (int j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
          for (int j = 0; j < n; ++j) row[j] /= sum;
          std::fill(row + n, row + kn, T(0));
          lh[i0 + i] = mx + std::log(sum);
        }
        gemm<T>(false, false, rows, HS, kn, T(1), s.data(), kn, vh, ldkv, T(0),
                oh + static_cast<int64_t>(i0) * ldo, ldo);
      }
    }
  }
}

template <class T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int B, int Sq, int NH, int HS,
                     const BlockLayout& at) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    for (int i = 0; i < Sq; ++i) {
      T& la = lse[bh * at.lse_ld + i];
      const T lb = lse_b[bh * at.lse_ld + i];
      const int64_t row = b * at.o_batch + i * at.o_ld + static_cast<int64_t>(h) * HS;
      T* oa = out + row;
      const T* ob = out_b + row;
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
void attention_block_delta(T* delta, const T* dout, const T* out, int B, int Sq, int NH, int HS,
                           const BlockLayout& at) {
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    for (int i = 0; i < Sq; ++i) {
      const int64_t row = b * at.o_batch + i * at.o_ld + static_cast<int64_t>(h) * HS;
      T d = 0;
      for (int k = 0; k < HS; ++k) d += dout[row + k] * out[row + k];
      delta[bh * at.lse_ld + i] = d;
    }
  }
}

template <class T>
void attention_block_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* lse,
                              const T* delta, int B, int Sq, int Sk, int NH, int KVH, int HS,
                              BlockMask mask, const BlockLayout& at) {
  if (Sq == 0 || Sk == 0) return;
  const int group = NH / KVH;
  const int ldq = static_cast<int>(at.q_ld), ldo = static_cast<int>(at.o_ld),
            ldkv = static_cast<int>(at.kv_ld);
  const T scale = T(1) / std::sqrt(T(HS));
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel
  {
    const int tile = tile_rows(mask, Sq);
    std::vector<T> p(static_cast<size_t>(tile) * Sk), dp(static_cast<size_t>(tile) * Sk);
#pragma omp for schedule(static)
    for (int bg = 0; bg < B * KVH; ++bg) {
      const int b = bg / KVH, g = bg % KVH;
      const T* kh = kv + b * at.kv_batch + static_cast<int64_t>(g) * HS;
      const T* vh = kh + static_cast<int64_t>(KVH) * HS;
      T* dkh = dkv + b * at.kv_batch + static_cast<int64_t>(g) * HS;
      T* dvh = dkh + static_cast<int64_t>(KVH) * HS;
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const int64_t bh = static_cast<int64_t>(b) * NH + h;
        for (int i0 = 0; i0 < Sq; i0 += tile) {
          const int rows = std::min(tile, Sq - i0);
          const int kn = tile_keys(mask, i0 + rows, Sk, at, b);
          if (kn == 0) continue;  // these rows see no key of the block
          const T* qh =
              q + b * at.q_batch + static_cast<int64_t>(i0) * ldq + static_cast<int64_t>(h) * HS;
          const int64_t o =
              b * at.o_batch + static_cast<int64_t>(i0) * ldo + static_cast<int64_t>(h) * HS;
          const T* doh = dout + o;
          T* dqh = dq + o;
          // P = exp(s − lse) of the merged row (0 for keys the row does not see).
          gemm<T>(false, true, rows, kn, HS, scale, qh, ldq, kh, ldkv, T(0), p.data(), kn);
          // dP = dout · vᵀ
          gemm<T>(false, true, rows, kn, HS, T(1), doh, ldo, vh, ldkv, T(0), dp.data(), kn);
          for (int i = 0; i < rows; ++i) {
            T* pr = p.data() + static_cast<size_t>(i) * kn;
            T* dr = dp.data() + static_cast<size_t>(i) * kn;
            const int n = visible(mask, i0 + i, Sk, at, b);
            const T l = lse[bh * at.lse_ld + i0 + i], d = delta[bh * at.lse_ld + i0 + i];
            for (int j = 0; j < kn; ++j) {
              const bool seen = j < n && l != neg_inf;
              pr[j] = seen ? std::exp(pr[j] - l) : T(0);
              dr[j] = pr[j] * (dr[j] - d);  // dS
            }
          }
          // dq += dS · k / √HS;  dk += dSᵀ · q / √HS;  dv += Pᵀ · dout.
          gemm<T>(false, false, rows, HS, kn, scale, dp.data(), kn, kh, ldkv, T(1), dqh, ldo);
          gemm<T>(true, false, kn, HS, rows, scale, dp.data(), kn, qh, ldq, T(1), dkh, ldkv);
          gemm<T>(true, false, kn, HS, rows, T(1), p.data(), kn, doh, ldo, T(1), dvh, ldkv);
        }
      }
    }
  }
}

#define STRATA_INSTANTIATE(T)                                                                   \
  template void attention_block_forward<T>(T*, T*, const T*, const T*, int, int, int, int, int, \
                                           int, BlockMask, const BlockLayout&);                 \
  template void attention_merge<T>(T*, T*, const T*, const T*, int, int, int, int,              \
                                   const BlockLayout&);                                         \
  template void attention_block_delta<T>(T*, const T*, const T*, int, int, int, int,            \
                                         const BlockLayout&);                                   \
  template void attention_block_backward<T>(T*, T*, const T*, const T*, const T*, const T*,     \
                                            const T*, int, int, int, int, int, int, BlockMask,  \
                                            const BlockLayout&);
STRATA_INSTANTIATE(float)
STRATA_INSTANTIATE(double)
#undef STRATA_INSTANTIATE

}  // namespace strata::kernels::cpu
