// ops.cc — CPU implementation of kernels/cpu/ops.h.
//
// GEMMs go to OpenBLAS. The build links Debian's OpenMP-flavoured OpenBLAS, which runs a GEMM
// single-threaded when it is called inside an OpenMP parallel region; attention relies on this
// to run one small single-threaded GEMM per (batch, head) pair on every thread at once.
//
// Reductions whose result lands in a shared gradient (dbias, LayerNorm's dweight/dbias, the
// embedding scatter) are parallelised over the output columns rather than the rows, so that no
// two threads write one element and each of these sums is taken in the same order whatever the
// thread count. Only sum_squares (a norm for clipping) reduces across threads, in an order that
// depends on their number; what the GEMMs do is OpenBLAS's choice.
#include "kernels/cpu/ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace strata::kernels::cpu {

namespace {

// Rows per block of the causal attention GEMMs: a block of query rows [i0, i1) only needs key
// columns [0, i1), which skips about half the work of the (S, S) products for long sequences
// while keeping each GEMM large enough for OpenBLAS to run near its peak.
constexpr int kAttentionBlock = 64;

// Columns per task of the column-parallel reductions: wide enough that the inner loop over a
// row's chunk vectorises, narrow enough that C = 384 still splits across several threads.
constexpr int kColumnChunk = 64;

// e^x for float without a library call, so that the loops calling it (softmax, GELU,
// cross-entropy) vectorise: glibc's expf is a scalar call that blocks vectorisation unless
// -ffast-math, and GELU over the (B, S, 4C) activation spent more time in tanhf than the MLP's
// GEMMs. Cephes' expf: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two so n·ln2 is exact), e^r
// by 1 + r + r²·P5(r) (measured worst relative error 8.3e-8, 1.4 ulp, over all floats in
// [-87, 87]), 2^n written into the exponent bits.
// Outside |x| ≤ 87, where 2^n would leave the normal range, the result saturates: 0 below −87
// and inf above 87 (libm returns ~1e-38 and up to 3.4e38 in the last unit of that band; no
// caller can tell: they add the term to 1 or divide by 1 + it). NaN propagates. The range tests
// compare bit patterns as integers: a float comparison would keep GCC from vectorising the loop
// unless -fno-trapping-math.
inline float exp_fast(float x) {
  int32_t ix;
  std::memcpy(&ix, &x, sizeof ix);
  const int32_t kLimitBits = 0x42AE0000;  // 87.0f
  const int32_t kInfBits = 0x7F800000;
  const int32_t mag = ix & 0x7FFFFFFF;
  // All-ones where 87 < |x| ≤ inf (not NaN). Selections are written as masks: GCC turns ?: on
  // them into branches here, which stops vectorisation.
  const int32_t outside = -static_cast<int32_t>((mag > kLimitBits) & (mag <= kInfBits));
  const int32_t saturated = -static_cast<int32_t>(ix >= 0) & kInfBits;  // e^x there: 0 or inf
  // Evaluate the outside lanes at ±87 (discarded below) so that n stays in range.
  const int32_t clamped = (ix & std::numeric_limits<int32_t>::min()) | kLimitBits;
  const int32_t iy = (ix & ~outside) | (clamped & outside);
  std::memcpy(&x, &iy, sizeof x);
  // Adding 1.5·2^23 rounds to an integer held in the low mantissa bits (round to nearest).
  const float kRound = 12582912.0f;
  const int32_t kRoundBits = 0x4B400000;  // bit pattern of kRound
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t tbits;
  std::memcpy(&tbits, &t, sizeof tbits);
  const int32_t ebits = (tbits - kRoundBits + 127) * (1 << 23);  // 2^n as float bits
  float scale;
  std::memcpy(&scale, &ebits, sizeof scale);
  const float y = p * scale;
  int32_t ybits;
  std::memcpy(&ybits, &y, sizeof ybits);
  ybits = (ybits & ~outside) | (saturated & outside);
  float result;
  std::memcpy(&result, &ybits, sizeof result);
  return result;
}

// The double instantiation is the finite-difference reference: libm's exp, exact to rounding.
inline float exp_t(float x) {
  return exp_fast(x);
}
inline double exp_t(double x) {
  return std::exp(x);
}

CBLAS_TRANSPOSE cblas_trans(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}

void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, A, lda, B, ldb, beta,
              C, ldc);
}

void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, A, lda, B, ldb, beta,
              C, ldc);
}

}  // namespace

void set_num_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

const char* blas_parallel_mode() {
  switch (openblas_get_parallel()) {
    case 0:
      return "serial";
    case 1:
      return "pthread";
    default:
      return "openmp";
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM and linear layers

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
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC) {
  if (dinp != nullptr) {
    // dinp (N, C) = dout (N, OC) · weight (OC, C)
    gemm<T>(false, false, N, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C);
  }
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C)
  gemm<T>(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias != nullptr) {
    const int chunks = (OC + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static)
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int o0 = chunk * kColumnChunk;
      const int o1 = std::min(OC, o0 + kColumnChunk);
      T acc[kColumnChunk] = {};  // (o1 - o0)
      for (int n = 0; n < N; ++n) {
        const T* row = dout + static_cast<size_t>(n) * OC;  // (OC)
        for (int o = o0; o < o1; ++o) acc[o - o0] += row[o];
      }
      for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C) {
  const T eps = T(1e-5);
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
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int c0 = chunk * kColumnChunk;
    const int c1 = std::min(C, c0 + kColumnChunk);
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
  }
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation)
//
// Computed through the identity 0.5·(1 + tanh(u)) = σ(2u) = 1 / (1 + e^(−2u)): one exp instead of
// a tanh (see exp_fast), and no overflow: e^(−2u) → inf gives σ = 0, e^(−2u) → 0 gives σ = 1.

template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  const T k = T(0.7978845608028654);  // √(2/π)
  const T c = T(0.044715);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = x / (T(1) + exp_t(T(-2) * k * (x + c * x * x * x)));
  }
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  const T k = T(0.7978845608028654);  // √(2/π)
  const T c = T(0.044715);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T s = T(1) / (T(1) + exp_t(T(-2) * k * (x + c * x * x * x)));  // σ(2u)
    // d/dx [x·σ(2u)] = σ(2u) + x·σ(2u)(1 − σ(2u))·2u', with u' = k·(1 + 3c·x²). w = 2k·σ(1 − σ)
    // is exactly 0 in both tails, and multiplying it into x one factor at a time keeps every
    // product finite there: x³ alone would overflow to inf and 0·inf give NaN for |x| > 1e12.
    const T w = T(2) * k * s * (T(1) - s);
    const T grad = s + w * x + T(3) * c * (((w * x) * x) * x);
    dinp[i] = grad * dout[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Causal self-attention

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int S, int NH, int HS) {
  const int ld = 3 * NH * HS;  // row stride of q, k, v inside qkv
  const int ldo = NH * HS;     // row stride of one head inside out
  const T scale = T(1) / std::sqrt(T(HS));
  // One (b, h) pair per iteration; the GEMMs inside run single-threaded (OpenMP OpenBLAS inside
  // a parallel region), so all threads work on different heads at once.
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const T* q = qkv + static_cast<size_t>(b) * S * ld + static_cast<size_t>(h) * HS;  // (S, HS)
    const T* k = q + static_cast<size_t>(NH) * HS;                                     // (S, HS)
    const T* v = q + 2 * static_cast<size_t>(NH) * HS;                                 // (S, HS)
    T* a = att + static_cast<size_t>(bh) * S * S;                                      // (S, S)
    T* o = out + static_cast<size_t>(b) * S * ldo + static_cast<size_t>(h) * HS;       // (S, HS)
    for (int i0 = 0; i0 < S; i0 += kAttentionBlock) {
      const int i1 = std::min(S, i0 + kAttentionBlock);
      const int rows = i1 - i0;
      // scores[i0:i1, 0:i1] = q[i0:i1] · k[0:i1]^T / √HS; later keys are masked anyway.
      gemm<T>(false, true, rows, i1, HS, scale, q + static_cast<size_t>(i0) * ld, ld, k, ld, T(0),
              a + static_cast<size_t>(i0) * S, S);
      for (int i = i0; i < i1; ++i) {
        T* row = a + static_cast<size_t>(i) * S;  // (S)
        // Subtracting the row max keeps exp() ≤ 1: no overflow whatever the scores.
        T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
        for (int j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j <= i; ++j) {
          row[j] = exp_t(row[j] - mx);
          sum += row[j];
        }
        const T inv = T(1) / sum;
#pragma omp simd
        for (int j = 0; j <= i; ++j) row[j] *= inv;
        for (int j = i + 1; j < S; ++j) row[j] = T(0);
      }
      // out[i0:i1] = att[i0:i1, 0:i1] · v[0:i1]
      gemm<T>(false, false, rows, HS, i1, T(1), a + static_cast<size_t>(i0) * S, S, v, ld, T(0),
              o + static_cast<size_t>(i0) * ldo, ldo);
    }
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, T* scratch, int B,
                        int S, int NH, int HS) {
  const int ld = 3 * NH * HS;
  const int ldo = NH * HS;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const size_t head = static_cast<size_t>(b) * S * ld + static_cast<size_t>(h) * HS;
    const T* q = qkv + head;                             // (S, HS), row stride ld
    const T* k = q + static_cast<size_t>(NH) * HS;       // (S, HS)
    const T* v = q + 2 * static_cast<size_t>(NH) * HS;   // (S, HS)
    T* dq = dqkv + head;                                 // (S, HS)
    T* dk = dq + static_cast<size_t>(NH) * HS;           // (S, HS)
    T* dv = dq + 2 * static_cast<size_t>(NH) * HS;       // (S, HS)
    const T* a = att + static_cast<size_t>(bh) * S * S;  // (S, S)
    const T* dy = dout + static_cast<size_t>(b) * S * ldo + static_cast<size_t>(h) * HS;  // (S, HS)
    T* d = scratch + static_cast<size_t>(omp_get_thread_num()) * S * S;  // (S, S): datt, then dpre

    for (int i0 = 0; i0 < S; i0 += kAttentionBlock) {
      const int i1 = std::min(S, i0 + kAttentionBlock);
      const int rows = i1 - i0;
      // datt[i0:i1, 0:i1] = dout[i0:i1] · v[0:i1]^T
      gemm<T>(false, true, rows, i1, HS, T(1), dy + static_cast<size_t>(i0) * ldo, ldo, v, ld, T(0),
              d + static_cast<size_t>(i0) * S, S);
      // Softmax backward on the causal part: dpre = att ⊙ (datt − Σ_j att ⊙ datt). The rest of
      // the row is zeroed because the dk GEMM below reads whole columns of dpre.
      for (int i = i0; i < i1; ++i) {
        const T* arow = a + static_cast<size_t>(i) * S;  // (S)
        T* drow = d + static_cast<size_t>(i) * S;        // (S)
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j <= i; ++j) dot += arow[j] * drow[j];
        for (int j = 0; j <= i; ++j) drow[j] = arow[j] * (drow[j] - dot);
        for (int j = i + 1; j < S; ++j) drow[j] = T(0);
      }
      // dq[i0:i1] = dpre[i0:i1, 0:i1] · k[0:i1] / √HS
      gemm<T>(false, false, rows, HS, i1, scale, d + static_cast<size_t>(i0) * S, S, k, ld, T(0),
              dq + static_cast<size_t>(i0) * ld, ld);
    }
    // Key/value rows j only receive from query rows i ≥ j (att and dpre are 0 above the
    // diagonal), so a block of key rows [j0, j1) needs query rows [j0, S) only.
    for (int j0 = 0; j0 < S; j0 += kAttentionBlock) {
      const int j1 = std::min(S, j0 + kAttentionBlock);
      const int rows = j1 - j0;
      const size_t corner = static_cast<size_t>(j0) * S + j0;  // element (j0, j0) of an (S, S)
      // dv[j0:j1] = att[j0:S, j0:j1]^T · dout[j0:S]
      gemm<T>(true, false, rows, HS, S - j0, T(1), a + corner, S,
              dy + static_cast<size_t>(j0) * ldo, ldo, T(0), dv + static_cast<size_t>(j0) * ld, ld);
      // dk[j0:j1] = dpre[j0:S, j0:j1]^T · q[j0:S] / √HS
      gemm<T>(true, false, rows, HS, S - j0, scale, d + corner, S, q + static_cast<size_t>(j0) * ld,
              ld, T(0), dk + static_cast<size_t>(j0) * ld, ld);
    }
  }
}

size_t attention_scratch_elems(int S) {
  return static_cast<size_t>(S) * S * static_cast<size_t>(omp_get_max_threads());
}

// ---------------------------------------------------------------------------------------------
// Embedding (vocab-parallel)

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int S,
                       int C, int vocab_start, int V_local) {
#pragma omp parallel for schedule(static)
  for (int bs = 0; bs < B * S; ++bs) {
    const int s = bs % S;
    const int32_t local = tokens[bs] - vocab_start;
    const bool own = local >= 0 && local < V_local;
    T* y = out + static_cast<size_t>(bs) * C;                                  // (C)
    const T* e = own ? wte + static_cast<size_t>(local) * C : nullptr;         // (C)
    const T* p = wpe != nullptr ? wpe + static_cast<size_t>(s) * C : nullptr;  // (C)
    for (int c = 0; c < C; ++c) y[c] = (e != nullptr ? e[c] : T(0)) + (p != nullptr ? p[c] : T(0));
  }
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int S, int C,
                        int vocab_start, int V_local) {
  // A token can repeat within the batch, so the scatter into dwte is parallel over channel
  // chunks, each thread walking every position in order (see the file comment).
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int c0 = chunk * kColumnChunk;
    const int c1 = std::min(C, c0 + kColumnChunk);
    for (int bs = 0; bs < B * S; ++bs) {
      const int32_t local = tokens[bs] - vocab_start;
      if (local < 0 || local >= V_local) continue;
      const T* dy = dout + static_cast<size_t>(bs) * C;  // (C)
      T* dw = dwte + static_cast<size_t>(local) * C;     // (C)
      for (int c = c0; c < c1; ++c) dw[c] += dy[c];
    }
    if (dwpe != nullptr) {
      for (int s = 0; s < S; ++s) {
        T* dp = dwpe + static_cast<size_t>(s) * C;  // (C)
        for (int b = 0; b < B; ++b) {
          const T* dy = dout + (static_cast<size_t>(b) * S + s) * C;  // (C)
          for (int c = c0; c < c1; ++c) dp[c] += dy[c];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel cross-entropy

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
void ce_losses(T* losses, const T* row_max, const T* row_sumexp, const T* target_logit, int N) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) losses[n] = std::log(row_sumexp[n]) + row_max[n] - target_logit[n];
}

template <class T>
void ce_backward(T* dlogits, const T* logits, const T* row_max, const T* row_sumexp,
                 const int32_t* targets, T scale, int N, int ld, int vocab_start, int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + static_cast<size_t>(n) * ld;  // (ld)
    T* drow = dlogits + static_cast<size_t>(n) * ld;      // (ld)
    const T mx = row_max[n];
    const T inv = T(1) / row_sumexp[n];
    const int32_t local = targets[n] - vocab_start;
#pragma omp simd
    for (int j = 0; j < valid; ++j) drow[j] = scale * (exp_t(row[j] - mx) * inv);
    // The one-hot term outside the loop, which a per-column test would keep from vectorising.
    if (local >= 0 && local < valid) drow[local] = scale * (exp_t(row[local] - mx) * inv - T(1));
    for (int j = valid; j < ld; ++j) drow[j] = T(0);
  }
}

// ---------------------------------------------------------------------------------------------
// Vector helpers

template <class T>
void add_inplace(T* y, const T* x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

template <class T>
void add(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void scale_inplace(T* y, T s, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

template <class T>
double sum_squares(const T* x, size_t n) {
  double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc)
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return acc;
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) {
  // Bias corrections in double: 1 - β2^step is ~1e-3 at step 1 and float's pow would cost digits.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_OPS(T)                                                              \
  template void gemm<T>(bool, bool, int, int, int, T, const T*, int, const T*, int, T, T*, int);   \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int);                \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);       \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);          \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, int, int);                                         \
  template void gelu_forward<T>(T*, const T*, size_t);                                             \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                                  \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int);                        \
  template void attention_backward<T>(T*, const T*, const T*, const T*, T*, int, int, int, int);   \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int,   \
                                     int);                                                         \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, int);  \
  template void ce_row_max<T>(T*, const T*, int, int, int);                                        \
  template void ce_row_sumexp<T>(T*, const T*, const T*, int, int, int);                           \
  template void ce_rescale_sumexp<T>(T*, const T*, const T*, int);                                 \
  template void ce_target_logit<T>(T*, const T*, const int32_t*, int, int, int, int);              \
  template void ce_losses<T>(T*, const T*, const T*, const T*, int);                               \
  template void ce_backward<T>(T*, const T*, const T*, const T*, const int32_t*, T, int, int, int, \
                               int);                                                               \
  template void add_inplace<T>(T*, const T*, size_t);                                              \
  template void add<T>(T*, const T*, const T*, size_t);                                            \
  template void scale_inplace<T>(T*, T, size_t);                                                   \
  template double sum_squares<T>(const T*, size_t);

STRATA_INSTANTIATE_CPU_OPS(float)
STRATA_INSTANTIATE_CPU_OPS(double)

#undef STRATA_INSTANTIATE_CPU_OPS

void cast_f32_to_bf16(uint16_t* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void cast_bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace strata::kernels::cpu
