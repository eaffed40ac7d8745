// attention.cc — CPU implementation of kernels/cpu/attention.h.
//
// One (batch, head) pair per OpenMP iteration, its GEMMs single-threaded: the build links
// Debian's OpenMP-flavoured OpenBLAS, which runs a GEMM single-threaded when it is called inside
// an OpenMP parallel region, so every thread runs one small GEMM at once.
#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

namespace {

// Rows per block of the attention GEMMs: a block of causal query rows [i0, i1) only needs key
// columns [0, i1), which skips about half the work of the (S, S) products for long sequences
// while keeping each GEMM large enough for OpenBLAS to run near its peak.
constexpr int kAttentionBlock = 64;

// The keys query rows see: row i sees [0, row_keys(i)); a block of rows [i0, i1) needs the
// columns [0, block_keys(i1)). len: the sequence's real keys.
struct KeyRange {
  bool causal;
  int len;
  int row_keys(int i) const { return causal ? std::min(i + 1, len) : len; }
  int block_keys(int i1) const { return causal ? std::min(i1, len) : len; }
  // The query rows that see key j: [first_query(j), S).
  int first_query(int j) const { return causal ? j : 0; }
};

// x[j] = e^(x[j] − shift) for j < n: once per vector width for float (each element computed alike).
template <class T>
[[gnu::always_inline]] inline void exp_shifted_loop(T* x, int n, T shift) {
#pragma omp simd
  for (int j = 0; j < n; ++j) x[j] = exp_t(x[j] - shift);
}

STRATA_CPU_CLONES void exp_shifted(float* x, int n, float shift) {
  exp_shifted_loop(x, n, shift);
}

void exp_shifted(double* x, int n, double shift) {
  exp_shifted_loop(x, n, shift);
}

}  // namespace

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int S, int NH, int KVH, int HS,
                       bool causal, const int32_t* key_len) {
  const int ld = (NH + 2 * KVH) * HS;  // row stride of q, k, v inside qkv
  const int group = NH / KVH;          // query heads per key/value head
  const int ldo = NH * HS;             // row stride of one head inside out
  const T scale = T(1) / std::sqrt(T(HS));
  // One (b, h) pair per iteration; the GEMMs inside run single-threaded (OpenMP OpenBLAS inside
  // a parallel region), so all threads work on different heads at once.
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const T* row0 = qkv + static_cast<size_t>(b) * S * ld;
    const T* q = row0 + static_cast<size_t>(h) * HS;                              // (S, HS)
    const T* k = row0 + static_cast<size_t>(NH + h / group) * HS;                 // (S, HS)
    const T* v = k + static_cast<size_t>(KVH) * HS;                               // (S, HS)
    T* a = att + static_cast<size_t>(bh) * S * S;                                 // (S, S)
    T* o = out + static_cast<size_t>(b) * S * ldo + static_cast<size_t>(h) * HS;  // (S, HS)
    const KeyRange keys{causal, key_len ? key_len[b] : S};
    for (int i0 = 0; i0 < S; i0 += kAttentionBlock) {
      const int i1 = std::min(S, i0 + kAttentionBlock);
      const int rows = i1 - i0;
      const int kn = keys.block_keys(i1);
      // scores[i0:i1, 0:kn] = q[i0:i1] · k[0:kn]^T / √HS; keys a row does not see are masked.
      gemm<T>(false, true, rows, kn, HS, scale, q + static_cast<size_t>(i0) * ld, ld, k, ld, T(0),
              a + static_cast<size_t>(i0) * S, S);
      for (int i = i0; i < i1; ++i) {
        T* row = a + static_cast<size_t>(i) * S;  // (S)
        const int n = keys.row_keys(i);
        // Subtracting the row max keeps exp() ≤ 1: no overflow whatever the scores.
        T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < n; ++j) mx = std::max(mx, row[j]);
        exp_shifted(row, n, mx);
        // The sum in its own loop, outside the clones: its order (the baseline's vector width)
        // stays the same on every CPU.
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; ++j) sum += row[j];
        const T inv = T(1) / sum;
#pragma omp simd
        for (int j = 0; j < n; ++j) row[j] *= inv;
        for (int j = n; j < S; ++j) row[j] = T(0);
      }
      // out[i0:i1] = att[i0:i1, 0:kn] · v[0:kn]
      gemm<T>(false, false, rows, HS, kn, T(1), a + static_cast<size_t>(i0) * S, S, v, ld, T(0),
              o + static_cast<size_t>(i0) * ldo, ldo);
    }
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, T* scratch, int B,
                        int S, int NH, int KVH, int HS, bool causal, const int32_t* key_len) {
  const int ld = (NH + 2 * KVH) * HS;
  const int ldo = NH * HS;
  const int group = NH / KVH;  // query heads per key/value head
  const T scale = T(1) / std::sqrt(T(HS));
  // One (batch, key/value head) pair per iteration: the query heads of its group run one after
  // the other, the first assigning dk and dv, the others adding to them (no two threads write
  // the same rows).
#pragma omp parallel for schedule(static)
  for (int bkv = 0; bkv < B * KVH; ++bkv) {
    const int b = bkv / KVH;
    const int kvh = bkv % KVH;
    const size_t row0 = static_cast<size_t>(b) * S * ld;
    const T* k = qkv + row0 + static_cast<size_t>(NH + kvh) * HS;        // (S, HS), row stride ld
    const T* v = k + static_cast<size_t>(KVH) * HS;                      // (S, HS)
    T* dk = dqkv + row0 + static_cast<size_t>(NH + kvh) * HS;            // (S, HS)
    T* dv = dk + static_cast<size_t>(KVH) * HS;                          // (S, HS)
    T* d = scratch + static_cast<size_t>(omp_get_thread_num()) * S * S;  // (S, S): datt, then dpre
    const KeyRange keys{causal, key_len ? key_len[b] : S};
    for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
      const T beta = h == kvh * group ? T(0) : T(1);          // dk, dv: assign, then accumulate
      const T* q = qkv + row0 + static_cast<size_t>(h) * HS;  // (S, HS)
      T* dq = dqkv + row0 + static_cast<size_t>(h) * HS;      // (S, HS)
      const T* a = att + (static_cast<size_t>(b) * NH + h) * S * S;  // (S, S)
      const T* dy =
          dout + static_cast<size_t>(b) * S * ldo + static_cast<size_t>(h) * HS;  // (S, HS)

      for (int i0 = 0; i0 < S; i0 += kAttentionBlock) {
        const int i1 = std::min(S, i0 + kAttentionBlock);
        const int rows = i1 - i0;
        const int kn = keys.block_keys(i1);
        // datt[i0:i1, 0:kn] = dout[i0:i1] · v[0:kn]^T
        gemm<T>(false, true, rows, kn, HS, T(1), dy + static_cast<size_t>(i0) * ldo, ldo, v, ld,
                T(0), d + static_cast<size_t>(i0) * S, S);
        // Softmax backward over the keys the row sees: dpre = att ⊙ (datt − Σ_j att ⊙ datt).
        // The rest of the row is zeroed because the dk GEMM below reads whole columns of dpre.
        for (int i = i0; i < i1; ++i) {
          const T* arow = a + static_cast<size_t>(i) * S;  // (S)
          T* drow = d + static_cast<size_t>(i) * S;        // (S)
          const int n = keys.row_keys(i);
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int j = 0; j < n; ++j) dot += arow[j] * drow[j];
          for (int j = 0; j < n; ++j) drow[j] = arow[j] * (drow[j] - dot);
          for (int j = n; j < S; ++j) drow[j] = T(0);
        }
        // dq[i0:i1] = dpre[i0:i1, 0:kn] · k[0:kn] / √HS
        gemm<T>(false, false, rows, HS, kn, scale, d + static_cast<size_t>(i0) * S, S, k, ld, T(0),
                dq + static_cast<size_t>(i0) * ld, ld);
      }
      // Key/value rows j only receive from the query rows that see them, [first_query(j), S)
      // (att and dpre are 0 elsewhere): causal, a block of key rows [j0, j1) needs query rows
      // [j0, S) only. Padded keys receive nothing: their rows of att and dpre are 0 (so the
      // GEMMs assign them 0).
      for (int j0 = 0; j0 < S; j0 += kAttentionBlock) {
        const int j1 = std::min(S, j0 + kAttentionBlock);
        const int rows = j1 - j0;
        const int i0 = keys.first_query(j0);
        const size_t corner = static_cast<size_t>(i0) * S + j0;  // element (i0, j0) of an (S, S)
        // dv[j0:j1] (+)= att[i0:S, j0:j1]^T · dout[i0:S]
        gemm<T>(true, false, rows, HS, S - i0, T(1), a + corner, S,
                dy + static_cast<size_t>(i0) * ldo, ldo, beta, dv + static_cast<size_t>(j0) * ld,
                ld);
        // dk[j0:j1] (+)= dpre[i0:S, j0:j1]^T · q[i0:S] / √HS
        gemm<T>(true, false, rows, HS, S - i0, scale, d + corner, S,
                q + static_cast<size_t>(i0) * ld, ld, beta, dk + static_cast<size_t>(j0) * ld, ld);
      }
    }
  }
}

template <class T>
void attention_decode(T* out, const T* q, const T* k, const T* v, int B, int Tn, int S_max, int NH,
                      int KVH, int HS, int pos0) {
  const int group = NH / KVH;
  const T scale = T(1) / std::sqrt(T(HS));
  const size_t kv_row = static_cast<size_t>(KVH) * HS;  // one position of the cache
#pragma omp parallel for schedule(static) collapse(2)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      std::vector<T> p(static_cast<size_t>(pos0 + Tn));
      const T* kb =
          k + static_cast<size_t>(b) * S_max * kv_row + static_cast<size_t>(h / group) * HS;
      const T* vb =
          v + static_cast<size_t>(b) * S_max * kv_row + static_cast<size_t>(h / group) * HS;
      for (int t = 0; t < Tn; ++t) {
        const T* qt = q + ((static_cast<size_t>(b) * Tn + t) * NH + h) * HS;
        T* o = out + ((static_cast<size_t>(b) * Tn + t) * NH + h) * HS;
        const int n = pos0 + t + 1;  // keys 0 … pos0 + t
        T mx = -std::numeric_limits<T>::infinity();
        for (int j = 0; j < n; ++j) {
          const T* kj = kb + static_cast<size_t>(j) * kv_row;
          T dot = 0;
          for (int i = 0; i < HS; ++i) dot += qt[i] * kj[i];
          p[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        T sum = 0;
        for (int j = 0; j < n; ++j) {
          p[static_cast<size_t>(j)] = exp_t(p[static_cast<size_t>(j)] - mx);
          sum += p[static_cast<size_t>(j)];
        }
        const T inv = T(1) / sum;
        for (int i = 0; i < HS; ++i) o[i] = T(0);
        for (int j = 0; j < n; ++j) {
          const T w = p[static_cast<size_t>(j)] * inv;
          const T* vj = vb + static_cast<size_t>(j) * kv_row;
          for (int i = 0; i < HS; ++i) o[i] += w * vj[i];
        }
      }
    }
  }
}

size_t attention_scratch_elems(int S) {
  return static_cast<size_t>(S) * S * static_cast<size_t>(omp_get_max_threads());
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_ATTENTION(T)                                                     \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, int, bool,           \
                                     const int32_t*);                                           \
  template void attention_backward<T>(T*, const T*, const T*, const T*, T*, int, int, int, int, \
                                      int, bool, const int32_t*);                               \
  template void attention_decode<T>(T*, const T*, const T*, const T*, int, int, int, int, int,  \
                                    int, int);

STRATA_INSTANTIATE_CPU_ATTENTION(float)
STRATA_INSTANTIATE_CPU_ATTENTION(double)

#undef STRATA_INSTANTIATE_CPU_ATTENTION

}  // namespace strata::kernels::cpu
