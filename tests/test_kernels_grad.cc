// test_kernels_grad.cc — the CPU kernels of kernels/cpu against references that do not
// share their code path:
//   * every backward against central finite differences of the DOUBLE forward, on the scalar
//     objective L = Σ r ⊙ out with r a fixed random tensor (so dout = r);
//   * the FLOAT instantiation against the DOUBLE one on larger shapes;
//   * properties and closed forms: softmax rows, CE padding, vocab sharding (embedding and CE),
//     AdamW, GEMM transposes against a naive triple loop, grouped-query attention as multi-head
//     attention on repeated key/value heads, RoPE's inverse and its relative-position property,
//     the per-head RMSNorm of the query and key heads against a naive loop over the heads.
//
// Tolerances used throughout:
//   kFdTol = 1e-6, relative to the largest |gradient| of the tensor checked. With h = 1e-5 the
//     central difference has truncation error ~h²·|L'''| ≈ 1e-10 and rounding error
//     ~ε·|L|/h ≈ 1e-16·10/1e-5 = 1e-10; 1e-6 leaves four orders of margin for the larger third
//     derivatives of softmax and rsqrt, while any indexing or formula error shows up at 1e-2 or
//     more.
//   kFloatTol = 1e-5, relative to the largest |value| of the tensor compared. Inputs are drawn in
//     float and widened exactly, so the only difference is float32 arithmetic: a sum of K terms
//     errs by ~√K·6e-8 of its terms' size in practice (K ≤ 400 here: 1.2e-6), plus ~2 ulp from
//     the float kernels' own exp and from rsqrt. Observed worst 1.6e-6 (GELU's backward); 1e-5
//     keeps a 6x margin and still fails on a precision regression such as a one-pass variance.
//   kFloatAttentionTol = 1e-4 for attention, whose test drives scores to ±70 on purpose: a
//     score's float rounding δ ≈ 70·6e-8·(a few) becomes a relative error δ of its probability
//     after exp. Observed worst 1.8e-6.
#include <gtest/gtest.h>
#include <strings.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/threads.h"
#include "kernels/cpu/util.h"

namespace cpu = strata::kernels::cpu;

namespace {

constexpr double kFdStep = 1e-5;
constexpr double kFdTol = 1e-6;
constexpr double kFloatTol = 1e-5;
constexpr double kFloatAttentionTol = 1e-4;

using Vec = std::vector<double>;

// Values representable exactly in float, so that a float copy holds the same numbers.
Vec random_vec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = static_cast<double>(static_cast<float>(dist(gen)));
  return v;
}

std::vector<int32_t> random_tokens(size_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(gen);
  return t;
}

std::vector<float> to_float(const Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The starting value of a gradient the kernel must assign: any read of it shows as NaN.
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// ∂L/∂x by central differences; loss() reads x.
Vec numeric_grad(Vec& x, const std::function<double()>& loss) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kFdStep;
    const double lp = loss();
    x[i] = saved - kFdStep;
    const double lm = loss();
    x[i] = saved;
    g[i] = (lp - lm) / (2 * kFdStep);
  }
  return g;
}

// |got - want| ≤ tol · max|want| elementwise, reporting the first few offenders.
template <class A>
void expect_close(const std::vector<A>& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  ASSERT_GT(scale, 0.0) << what << ": reference is identically zero, the check would be vacuous";
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, err / scale);
    if (!(err <= tol * scale)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << static_cast<double>(got[i]) << ", want "
                      << want[i] << " (scale " << scale << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size()
                    << " elements off; worst relative error " << worst;
}

// Sets the OpenMP/OpenBLAS thread count for one scope (ctest runs with OMP_NUM_THREADS=1).
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(cpu::num_threads()) { cpu::set_num_threads(n); }
  ~ScopedThreads() { cpu::set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// ---------------------------------------------------------------------------------------------
// GEMM

template <class T>
void check_gemm_transposes(double tol) {
  const int M = 7, N = 5, K = 6;
  const int pad = 3;  // row strides larger than the logical width, as for one head of qkv
  const T alpha = T(0.7), beta = T(-0.3);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // A is stored (M, K), or (K, M) when transposed; likewise B (K, N) or (N, K).
      const int a_rows = ta ? K : M, a_cols = ta ? M : K;
      const int b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      const Vec a = random_vec(static_cast<size_t>(a_rows) * lda, 1);  // (a_rows, lda)
      const Vec b = random_vec(static_cast<size_t>(b_rows) * ldb, 2);  // (b_rows, ldb)
      const Vec c0 = random_vec(static_cast<size_t>(M) * ldc, 3);      // (M, ldc)
      Vec want = c0;
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int k = 0; k < K; ++k) {
            const double aik = ta ? a[k * lda + i] : a[i * lda + k];
            const double bkj = tb ? b[j * ldb + k] : b[k * ldb + j];
            s += aik * bkj;
          }
          want[i * ldc + j] = double(alpha) * s + double(beta) * c0[i * ldc + j];
        }
      }
      std::vector<T> ta_(a.begin(), a.end()), tb_(b.begin(), b.end()), c(c0.begin(), c0.end());
      cpu::gemm<T>(ta, tb, M, N, K, alpha, ta_.data(), lda, tb_.data(), ldb, beta, c.data(), ldc);
      // The padding columns of C must be left alone, so compare the whole (M, ldc) buffer.
      expect_close(c, want, tol,
                   std::string("gemm ta=") + (ta ? "T" : "N") + " tb=" + (tb ? "T" : "N"));
    }
  }
}

TEST(KernelsGemm, TransposesMatchNaiveLoop) {
  // double: K = 6 products, rounding ~1e-16; float: ~6 ulp of 6e-8.
  check_gemm_transposes<double>(1e-12);
  check_gemm_transposes<float>(1e-5);
}

// ---------------------------------------------------------------------------------------------
// matmul

TEST(KernelsGrad, MatmulFiniteDifferences) {
  const int N = 3, C = 5, OC = 4;
  Vec inp = random_vec(N * C, 10);       // (N, C)
  Vec w = random_vec(OC * C, 11);        // (OC, C)
  Vec bias = random_vec(OC, 12);         // (OC)
  const Vec r = random_vec(N * OC, 13);  // (N, OC)
  Vec out(N * OC);                       // (N, OC)

  // Forward against a naive loop, with and without bias.
  cpu::matmul_forward<double>(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  Vec want(N * OC), want_nobias(N * OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * w[o * C + c];
      want_nobias[n * OC + o] = s;
      want[n * OC + o] = s + bias[o];
    }
  }
  expect_close(out, want, 1e-12, "matmul_forward");
  cpu::matmul_forward<double>(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  expect_close(out, want_nobias, 1e-12, "matmul_forward without bias");

  auto loss = [&] {
    cpu::matmul_forward<double>(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    return dot(r, out);
  };
  // Weight gradients start from random values: the backward must accumulate into them. The
  // input gradient starts as NaN: it must be assigned, never read.
  const Vec dw0 = random_vec(OC * C, 15), db0 = random_vec(OC, 16);
  Vec dinp(N * C, kNaN), dw = dw0, db = db0;
  cpu::matmul_backward<double>(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N,
                               C, OC);
  expect_close(dinp, numeric_grad(inp, loss), kFdTol, "matmul dinp");
  expect_close(minus(dw, dw0), numeric_grad(w, loss), kFdTol, "matmul dweight");
  expect_close(minus(db, db0), numeric_grad(bias, loss), kFdTol, "matmul dbias");

  // Null dinp and dbias are skipped and leave dweight as before.
  Vec dw_only = dw0;
  cpu::matmul_backward<double>(nullptr, dw_only.data(), nullptr, r.data(), inp.data(), w.data(), N,
                               C, OC);
  expect_close(minus(dw_only, dw0), minus(dw, dw0), 1e-12, "matmul dweight, null dinp/dbias");
}

TEST(KernelsFloat, MatmulMatchesDouble) {
  ScopedThreads threads(2);
  const int N = 67, C = 129, OC = 93;
  const Vec inp = random_vec(N * C, 20), w = random_vec(OC * C, 21), bias = random_vec(OC, 22);
  const Vec dout = random_vec(N * OC, 23);
  Vec out(N * OC), dinp(N * C, 0.0), dw(OC * C, 0.0), db(OC, 0.0);
  cpu::matmul_forward<double>(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu::matmul_backward<double>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                               N, C, OC);
  const auto finp = to_float(inp), fw = to_float(w), fbias = to_float(bias), fdout = to_float(dout);
  std::vector<float> fout(N * OC), fdinp(N * C, 0.f), fdw(OC * C, 0.f), fdb(OC, 0.f);
  cpu::matmul_forward<float>(fout.data(), finp.data(), fw.data(), fbias.data(), N, C, OC);
  cpu::matmul_backward<float>(fdinp.data(), fdw.data(), fdb.data(), fdout.data(), finp.data(),
                              fw.data(), N, C, OC);
  expect_close(fout, out, kFloatTol, "float matmul out");
  expect_close(fdinp, dinp, kFloatTol, "float matmul dinp");
  expect_close(fdw, dw, kFloatTol, "float matmul dweight");
  expect_close(fdb, db, kFloatTol, "float matmul dbias");
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST(KernelsGrad, LayerNormFiniteDifferences) {
  const int N = 3, C = 7;
  Vec inp = random_vec(N * C, 30, -2.0, 2.0);  // (N, C)
  Vec w = random_vec(C, 31, 0.5, 1.5);         // (C)
  Vec b = random_vec(C, 32);                   // (C)
  const Vec r = random_vec(N * C, 33);         // (N, C)
  Vec out(N * C), mean(N), rstd(N);            // (N, C), (N), (N)

  // BERT's eps (1e-12) where the variance is small enough for it to matter at 1e-12.
  {
    Vec tiny = inp;
    for (double& v : tiny) v *= 1e-5;
    cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), tiny.data(), w.data(),
                                   b.data(), N, C, 1e-12);
    for (int n = 0; n < N; ++n) {
      double s = 0, s2 = 0;
      for (int c = 0; c < C; ++c) s += tiny[n * C + c];
      const double mu = s / C;
      for (int c = 0; c < C; ++c) s2 += (tiny[n * C + c] - mu) * (tiny[n * C + c] - mu);
      EXPECT_NEAR(rstd[n] * std::sqrt(s2 / C + 1e-12), 1.0, 1e-12);
    }
  }
  // Forward against the textbook formula (biased variance, eps = 1e-5).
  cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                 b.data(), N, C);
  Vec want(N * C);
  for (int n = 0; n < N; ++n) {
    double s = 0, s2 = 0;
    for (int c = 0; c < C; ++c) s += inp[n * C + c];
    const double mu = s / C;
    for (int c = 0; c < C; ++c) s2 += (inp[n * C + c] - mu) * (inp[n * C + c] - mu);
    const double sd = std::sqrt(s2 / C + 1e-5);
    EXPECT_NEAR(mean[n], mu, 1e-12);
    EXPECT_NEAR(rstd[n], 1 / sd, 1e-12);
    for (int c = 0; c < C; ++c) want[n * C + c] = (inp[n * C + c] - mu) / sd * w[c] + b[c];
  }
  expect_close(out, want, 1e-12, "layernorm_forward");

  auto loss = [&] {
    cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                   b.data(), N, C);
    return dot(r, out);
  };
  loss();  // mean and rstd of the unperturbed input for the backward
  const Vec dinp0 = random_vec(N * C, 34), dw0 = random_vec(C, 35), db0 = random_vec(C, 36);
  Vec dinp = dinp0, dw = dw0, db = db0;
  cpu::layernorm_backward<double>(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(),
                                  mean.data(), rstd.data(), N, C);
  expect_close(minus(dinp, dinp0), numeric_grad(inp, loss), kFdTol, "layernorm dinp");
  expect_close(minus(dw, dw0), numeric_grad(w, loss), kFdTol, "layernorm dweight");
  expect_close(minus(db, db0), numeric_grad(b, loss), kFdTol, "layernorm dbias");
}

TEST(KernelsFloat, LayerNormMatchesDouble) {
  ScopedThreads threads(2);
  const int N = 33, C = 385;
  const Vec inp = random_vec(N * C, 40, -3.0, 3.0), w = random_vec(C, 41, 0.5, 1.5),
            b = random_vec(C, 42), dout = random_vec(N * C, 43);
  Vec out(N * C), mean(N), rstd(N), dinp(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                 b.data(), N, C);
  cpu::layernorm_backward<double>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                  w.data(), mean.data(), rstd.data(), N, C);
  const auto finp = to_float(inp), fw = to_float(w), fb = to_float(b), fdout = to_float(dout);
  std::vector<float> fout(N * C), fmean(N), frstd(N), fdinp(N * C, 0.f), fdw(C, 0.f), fdb(C, 0.f);
  cpu::layernorm_forward<float>(fout.data(), fmean.data(), frstd.data(), finp.data(), fw.data(),
                                fb.data(), N, C);
  cpu::layernorm_backward<float>(fdinp.data(), fdw.data(), fdb.data(), fdout.data(), finp.data(),
                                 fw.data(), fmean.data(), frstd.data(), N, C);
  expect_close(fout, out, kFloatTol, "float layernorm out");
  expect_close(frstd, rstd, kFloatTol, "float layernorm rstd");
  expect_close(fdinp, dinp, kFloatTol, "float layernorm dinp");
  expect_close(fdw, dw, kFloatTol, "float layernorm dweight");
  expect_close(fdb, db, kFloatTol, "float layernorm dbias");
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

TEST(KernelsGrad, RmsNormFiniteDifferences) {
  const int N = 3, C = 7;
  const double eps = 1e-5;
  Vec inp = random_vec(N * C, 170, -2.0, 2.0);  // (N, C)
  Vec w = random_vec(C, 171, 0.5, 1.5);         // (C)
  const Vec r = random_vec(N * C, 172);         // (N, C)
  Vec out(N * C), rstd(N);                      // (N, C), (N)

  // Forward against the definition: x / √(mean(x²) + eps) · w.
  cpu::rmsnorm_forward<double>(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
  Vec want(N * C);
  for (int n = 0; n < N; ++n) {
    double s2 = 0;
    for (int c = 0; c < C; ++c) s2 += inp[n * C + c] * inp[n * C + c];
    const double rms = std::sqrt(s2 / C + eps);
    EXPECT_NEAR(rstd[n], 1 / rms, 1e-12);
    for (int c = 0; c < C; ++c) want[n * C + c] = inp[n * C + c] / rms * w[c];
  }
  expect_close(out, want, 1e-12, "rmsnorm_forward");

  auto loss = [&] {
    cpu::rmsnorm_forward<double>(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
    return dot(r, out);
  };
  loss();  // rstd of the unperturbed input for the backward
  // Both gradients start from random values: the backward must accumulate into them.
  const Vec dinp0 = random_vec(N * C, 173), dw0 = random_vec(C, 174);
  Vec dinp = dinp0, dw = dw0;
  cpu::rmsnorm_backward<double>(dinp.data(), dw.data(), r.data(), inp.data(), w.data(), rstd.data(),
                                N, C);
  expect_close(minus(dinp, dinp0), numeric_grad(inp, loss), kFdTol, "rmsnorm dinp");
  expect_close(minus(dw, dw0), numeric_grad(w, loss), kFdTol, "rmsnorm dweight");
}

TEST(KernelsFloat, RmsNormMatchesDouble) {
  ScopedThreads threads(2);
  const int N = 33, C = 385;
  const Vec inp = random_vec(N * C, 180, -3.0, 3.0), w = random_vec(C, 181, 0.5, 1.5),
            dout = random_vec(N * C, 182);
  Vec out(N * C), rstd(N), dinp(N * C, 0.0), dw(C, 0.0);
  cpu::rmsnorm_forward<double>(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-6);
  cpu::rmsnorm_backward<double>(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(),
                                rstd.data(), N, C);
  const auto finp = to_float(inp), fw = to_float(w), fdout = to_float(dout);
  std::vector<float> fout(N * C), frstd(N), fdinp(N * C, 0.f), fdw(C, 0.f);
  cpu::rmsnorm_forward<float>(fout.data(), frstd.data(), finp.data(), fw.data(), N, C, 1e-6f);
  cpu::rmsnorm_backward<float>(fdinp.data(), fdw.data(), fdout.data(), finp.data(), fw.data(),
                               frstd.data(), N, C);
  expect_close(fout, out, kFloatTol, "float rmsnorm out");
  expect_close(frstd, rstd, kFloatTol, "float rmsnorm rstd");
  expect_close(fdinp, dinp, kFloatTol, "float rmsnorm dinp");
  expect_close(fdw, dw, kFloatTol, "float rmsnorm dweight");
}

// ---------------------------------------------------------------------------------------------
// Per-head RMSNorm of the query and key heads (Qwen3's q_norm and k_norm)

void check_qk_rmsnorm(int N, int NH, int KVH, int HS, uint64_t seed) {
  SCOPED_TRACE("qk_rmsnorm N=" + std::to_string(N) + " NH=" + std::to_string(NH) +
               " KVH=" + std::to_string(KVH) + " HS=" + std::to_string(HS));
  const int W = (NH + 2 * KVH) * HS, heads = NH + KVH;
  const double eps = 1e-5;
  Vec x = random_vec(static_cast<size_t>(N) * W, seed, -2.0, 2.0);  // (N, NH + 2·KVH, HS)
  Vec qw = random_vec(HS, seed + 1, 0.5, 1.5), kw = random_vec(HS, seed + 2, 0.5, 1.5);  // (HS)
  const Vec r = random_vec(x.size(), seed + 3);  // (N, NH + 2·KVH, HS)

  // Forward against a naive loop over the heads: x / √(mean(x²) + eps) · (q or k weight).
  Vec y = x, rstd(static_cast<size_t>(N) * heads);  // (N, NH + 2·KVH, HS), (N, NH + KVH)
  cpu::qk_rmsnorm_forward<double>(y.data(), rstd.data(), qw.data(), kw.data(), N, NH, KVH, HS, eps);
  Vec want = x;
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < heads; ++h) {
      const double* head = &x[static_cast<size_t>(n) * W + h * HS];
      double s2 = 0;
      for (int d = 0; d < HS; ++d) s2 += head[d] * head[d];
      const double rms = std::sqrt(s2 / HS + eps);
      EXPECT_NEAR(rstd[n * heads + h], 1 / rms, 1e-12) << "position " << n << " head " << h;
      const Vec& w = h < NH ? qw : kw;
      for (int d = 0; d < HS; ++d)
        want[static_cast<size_t>(n) * W + h * HS + d] = head[d] / rms * w[d];
    }
  }
  expect_close(y, want, 1e-12, "qk_rmsnorm_forward");
  for (int n = 0; n < N; ++n)  // the value heads bit for bit as they were
    for (int e = (NH + KVH) * HS; e < W; ++e)
      ASSERT_EQ(y[n * W + e], x[n * W + e]) << "value element " << e << " of position " << n;

  // L = Σ r ⊙ qk_rmsnorm(x): the value heads pass through, so their gradient is r, which the
  // backward leaves in dqkv.
  Vec buf(x.size()), rstd_buf(rstd.size());
  auto loss = [&] {
    buf = x;
    cpu::qk_rmsnorm_forward<double>(buf.data(), rstd_buf.data(), qw.data(), kw.data(), N, NH, KVH,
                                    HS, eps);
    return dot(r, buf);
  };
  // The weight gradients start from random values (the backward accumulates into them); the
  // pre-norm x's value heads are NaN (the backward must not read them).
  const Vec dq0 = random_vec(HS, seed + 4), dk0 = random_vec(HS, seed + 5);
  Vec dqkv = r, dq = dq0, dk = dk0, x_read = x;
  for (int n = 0; n < N; ++n)
    for (int e = (NH + KVH) * HS; e < W; ++e) x_read[n * W + e] = kNaN;
  cpu::qk_rmsnorm_backward<double>(dqkv.data(), dq.data(), dk.data(), x_read.data(), qw.data(),
                                   kw.data(), rstd.data(), N, NH, KVH, HS);
  for (int n = 0; n < N; ++n)
    for (int e = (NH + KVH) * HS; e < W; ++e)
      ASSERT_EQ(dqkv[n * W + e], r[n * W + e]) << "value element " << e << " of position " << n;
  expect_close(dqkv, numeric_grad(x, loss), kFdTol, "qk_rmsnorm dqkv");
  expect_close(minus(dq, dq0), numeric_grad(qw, loss), kFdTol, "qk_rmsnorm dq_weight");
  expect_close(minus(dk, dk0), numeric_grad(kw, loss), kFdTol, "qk_rmsnorm dk_weight");
}

TEST(KernelsGrad, QkRmsNormFiniteDifferences) {
  check_qk_rmsnorm(3, 4, 2, 6, 190);  // grouped-query, HS even
  check_qk_rmsnorm(2, 3, 3, 5, 191);  // multi-head (NH = KVH), HS odd
  check_qk_rmsnorm(3, 4, 1, 7, 192);  // multi-query (KVH = 1), HS odd
  check_qk_rmsnorm(2, 2, 1, 8, 193);  // KVH = 1, HS even
}

TEST(KernelsFloat, QkRmsNormMatchesDouble) {
  ScopedThreads threads(2);
  const int N = 37, NH = 8, KVH = 2, HS = 128, W = (NH + 2 * KVH) * HS;  // Qwen3's head size
  const size_t n = static_cast<size_t>(N) * W;
  const Vec x = random_vec(n, 195, -3.0, 3.0), dy = random_vec(n, 196);
  const Vec qw = random_vec(HS, 197, 0.5, 1.5), kw = random_vec(HS, 198, 0.5, 1.5);
  Vec y = x, rstd(static_cast<size_t>(N) * (NH + KVH)), dx = dy, dq(HS, 0.0), dk(HS, 0.0);
  cpu::qk_rmsnorm_forward<double>(y.data(), rstd.data(), qw.data(), kw.data(), N, NH, KVH, HS,
                                  1e-6);
  cpu::qk_rmsnorm_backward<double>(dx.data(), dq.data(), dk.data(), x.data(), qw.data(), kw.data(),
                                   rstd.data(), N, NH, KVH, HS);
  const auto fx = to_float(x), fqw = to_float(qw), fkw = to_float(kw);
  auto fy = fx, fdx = to_float(dy);
  std::vector<float> frstd(rstd.size()), fdq(HS, 0.f), fdk(HS, 0.f);
  cpu::qk_rmsnorm_forward<float>(fy.data(), frstd.data(), fqw.data(), fkw.data(), N, NH, KVH, HS,
                                 1e-6f);
  cpu::qk_rmsnorm_backward<float>(fdx.data(), fdq.data(), fdk.data(), fx.data(), fqw.data(),
                                  fkw.data(), frstd.data(), N, NH, KVH, HS);
  expect_close(fy, y, kFloatTol, "float qk_rmsnorm out");
  expect_close(frstd, rstd, kFloatTol, "float qk_rmsnorm rstd");
  expect_close(fdx, dx, kFloatTol, "float qk_rmsnorm dqkv");
  expect_close(fdq, dq, kFloatTol, "float qk_rmsnorm dq_weight");
  expect_close(fdk, dk, kFloatTol, "float qk_rmsnorm dk_weight");
}

// ---------------------------------------------------------------------------------------------
// GELU

TEST(KernelsGrad, GeluFiniteDifferences) {
  const size_t n = 11;
  Vec x = random_vec(n, 50, -4.0, 4.0);  // (n)
  const Vec r = random_vec(n, 51);       // (n)
  Vec out(n);                            // (n)
  // A published value of GPT-2's gelu_new: gelu(1) = 0.5·(1 + tanh(√(2/π)·1.044715)).
  const double one = 1.0;
  double y1 = 0;
  cpu::gelu_forward<double>(&y1, &one, 1);
  EXPECT_NEAR(y1, 0.8411919906082768, 1e-12);

  auto loss = [&] {
    cpu::gelu_forward<double>(out.data(), x.data(), n);
    return dot(r, out);
  };
  Vec dx(n, kNaN);  // assigned, never read
  cpu::gelu_backward<double>(dx.data(), x.data(), r.data(), n);
  expect_close(dx, numeric_grad(x, loss), kFdTol, "gelu dinp");
}

// BERT's exact GELU x·Φ(x) and tanh (its pooler).
TEST(KernelsGrad, GeluErfAndTanhFiniteDifferences) {
  const size_t n = 11;
  Vec x = random_vec(n, 55, -4.0, 4.0);  // (n)
  const Vec r = random_vec(n, 56);       // (n)
  Vec out(n);                            // (n)
  // Closed forms: gelu(1) = Φ(1) = 0.8413447460685429…, gelu(−1) = −(1 − Φ(1)), tanh(0.5).
  const double xs[] = {1.0, -1.0, 0.5};
  double ys[3];
  cpu::gelu_erf_forward<double>(ys, xs, 2);
  EXPECT_NEAR(ys[0], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(ys[1], -0.15865525393145707, 1e-15);
  cpu::tanh_forward<double>(ys, xs + 2, 1);
  EXPECT_NEAR(ys[0], 0.46211715726000974, 1e-15);

  auto gelu_loss = [&] {
    cpu::gelu_erf_forward<double>(out.data(), x.data(), n);
    return dot(r, out);
  };
  Vec dx(n, kNaN);  // assigned, never read
  cpu::gelu_erf_backward<double>(dx.data(), x.data(), r.data(), n);
  expect_close(dx, numeric_grad(x, gelu_loss), kFdTol, "gelu erf dinp");

  auto tanh_loss = [&] {
    cpu::tanh_forward<double>(out.data(), x.data(), n);
    return dot(r, out);
  };
  tanh_loss();
  Vec dt(n, kNaN);
  cpu::tanh_backward<double>(dt.data(), out.data(), r.data(), n);
  expect_close(dt, numeric_grad(x, tanh_loss), kFdTol, "tanh dinp");

  // Float against double, and the far tails stay finite.
  const size_t m = 10007;
  const Vec big = random_vec(m, 57, -6.0, 6.0), g = random_vec(m, 58);
  Vec o(m), d(m);
  cpu::gelu_erf_forward<double>(o.data(), big.data(), m);
  cpu::gelu_erf_backward<double>(d.data(), big.data(), g.data(), m);
  const auto fb = to_float(big), fg = to_float(g);
  std::vector<float> fo(m), fd(m);
  cpu::gelu_erf_forward<float>(fo.data(), fb.data(), m);
  cpu::gelu_erf_backward<float>(fd.data(), fb.data(), fg.data(), m);
  expect_close(fo, o, kFloatTol, "float gelu erf out");
  expect_close(fd, d, kFloatTol, "float gelu erf dinp");
  const float tails[] = {-1e30f, -50.f, 50.f, 1e30f};
  float ty[4], tg[4];
  const float ones[4] = {1.f, 1.f, 1.f, 1.f};
  cpu::gelu_erf_forward<float>(ty, tails, 4);
  cpu::gelu_erf_backward<float>(tg, tails, ones, 4);
  EXPECT_EQ(ty[0], 0.f);
  EXPECT_EQ(ty[3], 1e30f);
  EXPECT_EQ(tg[0], 0.f);
  EXPECT_EQ(tg[3], 1.f);
}

TEST(KernelsFloat, GeluMatchesDouble) {
  ScopedThreads threads(2);
  const size_t n = 10007;
  const Vec x = random_vec(n, 53, -6.0, 6.0), dout = random_vec(n, 54);
  Vec out(n), dx(n, 0.0);
  cpu::gelu_forward<double>(out.data(), x.data(), n);
  cpu::gelu_backward<double>(dx.data(), x.data(), dout.data(), n);
  const auto fx = to_float(x), fdout = to_float(dout);
  std::vector<float> fout(n), fdx(n, 0.f);
  cpu::gelu_forward<float>(fout.data(), fx.data(), n);
  cpu::gelu_backward<float>(fdx.data(), fx.data(), fdout.data(), n);
  expect_close(fout, out, kFloatTol, "float gelu out");
  expect_close(fdx, dx, kFloatTol, "float gelu dinp");
}

TEST(KernelsGelu, FloatExtremesAndNaN) {
  // Far tails, where the float kernel's exp saturates to 0 or inf and x³ overflows: gelu(x) = x
  // and gelu'(x) = 1 for large x, both 0 (to float precision: e^(−2u) < 1e-300) for very
  // negative x; never inf or NaN from a finite input, and a NaN input stays NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {10.f, 100.f, 1e4f, 3e38f, -20.f, -100.f, -1e4f, -3e38f, nan};
  std::vector<float> y(x.size()), dx(x.size(), 0.f);
  const std::vector<float> ones(x.size(), 1.f);
  cpu::gelu_forward<float>(y.data(), x.data(), x.size());
  cpu::gelu_backward<float>(dx.data(), x.data(), ones.data(), x.size());
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    if (x[i] > 0) {
      EXPECT_EQ(y[i], x[i]) << "x = " << x[i];
      EXPECT_EQ(dx[i], 1.f) << "x = " << x[i];
    } else {
      EXPECT_LE(std::fabs(y[i]), 1e-30f) << "x = " << x[i];
      EXPECT_LE(std::fabs(dx[i]), 1e-30f) << "x = " << x[i];
    }
  }
  EXPECT_TRUE(std::isnan(y.back()));
  EXPECT_TRUE(std::isnan(dx.back()));
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

// out (N, F) = silu(gate) · up from the definition, silu(g) = g / (1 + e^(−g)).
Vec naive_swiglu(const Vec& gate_up, int N, int F) {
  Vec out(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < F; ++i) {
      const double g = gate_up[n * 2 * F + i], u = gate_up[n * 2 * F + F + i];
      out[n * F + i] = g / (1 + std::exp(-g)) * u;
    }
  }
  return out;
}

TEST(KernelsGrad, SwiGluFiniteDifferences) {
  const int N = 3, F = 5;
  Vec gate_up = random_vec(N * 2 * F, 190, -6.0, 6.0);  // (N, 2F): [gate | up] per row
  const Vec r = random_vec(N * F, 191);                 // (N, F)
  Vec out(N * F);                                       // (N, F)
  cpu::swiglu_forward<double>(out.data(), gate_up.data(), N, F);
  expect_close(out, naive_swiglu(gate_up, N, F), 1e-14, "swiglu_forward");

  auto loss = [&] {
    cpu::swiglu_forward<double>(out.data(), gate_up.data(), N, F);
    return dot(r, out);
  };
  Vec dgate_up(N * 2 * F, kNaN);  // assigned, never read
  cpu::swiglu_backward<double>(dgate_up.data(), r.data(), gate_up.data(), N, F);
  expect_close(dgate_up, numeric_grad(gate_up, loss), kFdTol, "swiglu dgate_up");
}

TEST(KernelsFloat, SwiGluMatchesDouble) {
  ScopedThreads threads(2);
  const int N = 33, F = 301;
  const Vec gate_up = random_vec(N * 2 * F, 200, -8.0, 8.0), dout = random_vec(N * F, 201);
  Vec out(N * F), dgate_up(N * 2 * F, 0.0);
  cpu::swiglu_forward<double>(out.data(), gate_up.data(), N, F);
  cpu::swiglu_backward<double>(dgate_up.data(), dout.data(), gate_up.data(), N, F);
  const auto fgate_up = to_float(gate_up), fdout = to_float(dout);
  std::vector<float> fout(N * F), fdgate_up(N * 2 * F, 0.f);
  cpu::swiglu_forward<float>(fout.data(), fgate_up.data(), N, F);
  cpu::swiglu_backward<float>(fdgate_up.data(), fdout.data(), fgate_up.data(), N, F);
  expect_close(fout, out, kFloatTol, "float swiglu out");
  expect_close(fdgate_up, dgate_up, kFloatTol, "float swiglu dgate_up");
}

TEST(KernelsSwiGlu, FloatExtremesAndNaN) {
  // Far tails of the gate, where e^(−g) alone would overflow float: silu(g) = g and silu'(g) = 1
  // for large g; both 0 (to float precision) for very negative g; never inf or NaN from a finite
  // gate, and a NaN gate stays NaN. up = dout = 1, so out = silu(g), dgate = silu'(g) and
  // dup = silu(g).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> gate = {20.f, 100.f, 1e4f, 3e38f, -20.f, -100.f, -1e4f, -3e38f, nan};
  const int F = static_cast<int>(gate.size());
  std::vector<float> gate_up(gate);  // (1, 2F)
  gate_up.resize(2 * F, 1.f);
  const std::vector<float> ones(F, 1.f);
  std::vector<float> y(F), d(2 * F, nan);
  cpu::swiglu_forward<float>(y.data(), gate_up.data(), 1, F);
  cpu::swiglu_backward<float>(d.data(), ones.data(), gate_up.data(), 1, F);
  for (int i = 0; i + 1 < F; ++i) {
    const float g = gate[i];
    if (g > 0) {
      EXPECT_EQ(y[i], g) << "g = " << g;
      EXPECT_EQ(d[i], 1.f) << "g = " << g;
      EXPECT_EQ(d[F + i], g) << "g = " << g;
    } else {
      // silu(−20) = −20·e^(−20)/(1 + e^(−20)) ≈ −4.1e-8: the one gate here whose output is small
      // but not 0 in float.
      EXPECT_LE(std::fabs(y[i]), 5e-8f) << "g = " << g;
      EXPECT_LE(std::fabs(d[i]), 5e-8f) << "g = " << g;
      EXPECT_LE(std::fabs(d[F + i]), 5e-8f) << "g = " << g;
    }
  }
  EXPECT_TRUE(std::isnan(y[F - 1]));
  EXPECT_TRUE(std::isnan(d[F - 1]));
  EXPECT_TRUE(std::isnan(d[2 * F - 1]));
}

// ---------------------------------------------------------------------------------------------
// Attention

// Naive grouped-query attention, one score at a time, straight from the definition:
// qkv (B, S, NH + 2·KVH, HS), query head h reads key and value head h / (NH / KVH); query i of
// sequence b sees key j when j ≤ i (causal; any j otherwise) and j < len[b] (len given).
void naive_attention(Vec& out, Vec& att, const Vec& qkv, int B, int S, int NH, int KVH, int HS,
                     bool causal = true, const std::vector<int32_t>* len = nullptr) {
  const int W = (NH + 2 * KVH) * HS;  // row width of qkv
  const int group = NH / KVH;
  for (int b = 0; b < B; ++b) {
    const int n = len ? (*len)[static_cast<size_t>(b)] : S;
    const auto sees = [&](int i, int j) { return (!causal || j <= i) && j < n; };
    for (int h = 0; h < NH; ++h) {
      const int k_off = (NH + h / group) * HS;        // this query head's key head in a row
      const int v_off = (NH + KVH + h / group) * HS;  // and its value head
      for (int i = 0; i < S; ++i) {
        std::vector<double> p(S, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < S; ++j) {
          if (!sees(i, j)) continue;
          double s = 0;
          for (int d = 0; d < HS; ++d) {
            s += qkv[(b * S + i) * W + h * HS + d] * qkv[(b * S + j) * W + k_off + d];
          }
          p[j] = s / std::sqrt(double(HS));
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int j = 0; j < S; ++j) z += sees(i, j) ? std::exp(p[j] - mx) : 0.0;
        for (int j = 0; j < S; ++j) {
          const double a = sees(i, j) ? std::exp(p[j] - mx) / z : 0.0;
          att[((b * NH + h) * S + i) * S + j] = a;
        }
        for (int d = 0; d < HS; ++d) {
          double o = 0;
          for (int j = 0; j < S; ++j) {
            o += att[((b * NH + h) * S + i) * S + j] * qkv[(b * S + j) * W + v_off + d];
          }
          out[(b * S + i) * NH * HS + h * HS + d] = o;
        }
      }
    }
  }
}

void check_attention_grad(int B, int S, int NH, int KVH, int HS, int threads, uint64_t seed,
                          bool causal = true, const std::vector<int32_t>* len = nullptr) {
  SCOPED_TRACE("attention B=" + std::to_string(B) + " S=" + std::to_string(S) +
               " NH=" + std::to_string(NH) + " KVH=" + std::to_string(KVH) +
               " HS=" + std::to_string(HS) + " threads=" + std::to_string(threads) +
               (causal ? " causal" : " bidirectional") + (len ? " padded" : ""));
  const int32_t* kl = len ? len->data() : nullptr;
  ScopedThreads scoped(threads);
  const size_t nqkv = static_cast<size_t>(B) * S * (NH + 2 * KVH) * HS;
  const size_t nout = static_cast<size_t>(B) * S * NH * HS;
  const size_t natt = static_cast<size_t>(B) * NH * S * S;
  // Scores of magnitude ~HS·1.5² make the softmax far from uniform, so its curvature is exercised.
  Vec qkv = random_vec(nqkv, seed, -1.5, 1.5);  // (B, S, NH + 2·KVH, HS)
  const Vec r = random_vec(nout, seed + 1);     // (B, S, NH, HS)
  Vec out(nout), att(natt);                     // (B, S, NH, HS), (B, NH, S, S)

  cpu::attention_forward<double>(out.data(), att.data(), qkv.data(), B, S, NH, KVH, HS, causal, kl);
  Vec want_out(nout), want_att(natt);
  naive_attention(want_out, want_att, qkv, B, S, NH, KVH, HS, causal, len);
  expect_close(out, want_out, 1e-12, "attention out");
  expect_close(att, want_att, 1e-12, "attention att");

  auto loss = [&] {
    cpu::attention_forward<double>(out.data(), att.data(), qkv.data(), B, S, NH, KVH, HS, causal,
                                   kl);
    return dot(r, out);
  };
  loss();  // att of the unperturbed input for the backward
  // NaN-filled gradient and scratch: the backward assigns dqkv and must not read scratch it has
  // not written.
  Vec dqkv(nqkv, kNaN);
  Vec scratch(cpu::attention_scratch_elems(S), kNaN);
  cpu::attention_backward<double>(dqkv.data(), r.data(), qkv.data(), att.data(), scratch.data(), B,
                                  S, NH, KVH, HS, causal, kl);
  expect_close(dqkv, numeric_grad(qkv, loss), kFdTol, "attention dqkv");
}

TEST(KernelsGrad, AttentionFiniteDifferences) {
  check_attention_grad(2, 5, 2, 2, 3, 1, 60);
  // Two threads: each uses its own slice of scratch.
  check_attention_grad(2, 5, 2, 2, 3, 2, 61);
  // S = 70 spans two of the kernel's 64-row causal blocks, one of them partial.
  check_attention_grad(1, 70, 1, 1, 2, 1, 62);
  check_attention_grad(1, 1, 1, 1, 4, 1, 63);  // a single position: att = 1, out = v
}

// BERT's attention: every query sees every real key of its sequence; padded keys (j ≥ len[b]) are
// never seen and get exactly zero gradient (the finite differences of their q/k/v entries are 0,
// and padded query rows still attend to the real keys).
TEST(KernelsGrad, BidirectionalPaddedAttentionFiniteDifferences) {
  check_attention_grad(2, 5, 2, 2, 3, 1, 80, /*causal=*/false);
  const std::vector<int32_t> len = {5, 3};
  check_attention_grad(2, 5, 2, 2, 3, 1, 81, false, &len);
  check_attention_grad(2, 5, 2, 2, 3, 2, 82, false, &len);  // two threads
  check_attention_grad(2, 5, 4, 2, 3, 1, 83, false, &len);  // grouped-query
  check_attention_grad(2, 5, 2, 2, 3, 1, 84, true, &len);   // causal and padded
  const std::vector<int32_t> one = {1, 2};                  // a single real key
  check_attention_grad(2, 5, 2, 2, 3, 1, 85, false, &one);
  const std::vector<int32_t> long_len = {66, 70};  // blocks of 64, one partial
  check_attention_grad(2, 70, 1, 1, 2, 1, 86, false, &long_len);
}

// Grouped-query (KVH < NH) and multi-query (KVH = 1) attention: a key/value head's gradient sums
// over the query heads of its group, which the finite differences see directly.
TEST(KernelsGrad, GroupedQueryAttentionFiniteDifferences) {
  check_attention_grad(2, 5, 4, 4, 3, 1, 64);  // KVH = NH: multi-head, as before
  check_attention_grad(2, 5, 4, 2, 3, 1, 65);
  check_attention_grad(2, 5, 4, 1, 3, 1, 66);
  // Two threads, one (batch, key/value head) pair each at a time.
  check_attention_grad(2, 5, 4, 2, 3, 2, 67);
  check_attention_grad(2, 5, 4, 1, 3, 2, 68);
  check_attention_grad(1, 70, 4, 2, 2, 1, 69);  // two causal blocks, one partial
}

// Grouped-query attention is multi-head attention on key/value heads repeated NH / KVH times
// (Hugging Face's repeat_kv: query head h reads copy h of kv head h / group): same output and
// probabilities, same dq, and each shared head's dk, dv the sum of its copies'.
TEST(KernelsAttention, GroupedQueryEqualsRepeatedKeyValueHeads) {
  ScopedThreads threads(2);
  const int B = 2, S = 9, NH = 6, KVH = 2, HS = 4, group = NH / KVH;
  const int Wg = (NH + 2 * KVH) * HS, Wm = 3 * NH * HS;  // row widths of the two qkv
  const Vec gqa = random_vec(static_cast<size_t>(B) * S * Wg, 75, -1.5, 1.5);
  Vec mha(static_cast<size_t>(B) * S * Wm);  // (B, S, 3, NH, HS)
  for (int bs = 0; bs < B * S; ++bs) {
    for (int h = 0; h < NH; ++h) {
      for (int d = 0; d < HS; ++d) {
        mha[bs * Wm + h * HS + d] = gqa[bs * Wg + h * HS + d];
        mha[bs * Wm + (NH + h) * HS + d] = gqa[bs * Wg + (NH + h / group) * HS + d];
        mha[bs * Wm + (2 * NH + h) * HS + d] = gqa[bs * Wg + (NH + KVH + h / group) * HS + d];
      }
    }
  }
  const size_t nout = static_cast<size_t>(B) * S * NH * HS, natt = size_t(B) * NH * S * S;
  const Vec dout = random_vec(nout, 76);
  Vec out_g(nout), att_g(natt), out_m(nout), att_m(natt);
  Vec dg(gqa.size(), kNaN), dm(mha.size(), kNaN), scratch(cpu::attention_scratch_elems(S));
  cpu::attention_forward<double>(out_g.data(), att_g.data(), gqa.data(), B, S, NH, KVH, HS);
  cpu::attention_forward<double>(out_m.data(), att_m.data(), mha.data(), B, S, NH, NH, HS);
  cpu::attention_backward<double>(dg.data(), dout.data(), gqa.data(), att_g.data(), scratch.data(),
                                  B, S, NH, KVH, HS);
  cpu::attention_backward<double>(dm.data(), dout.data(), mha.data(), att_m.data(), scratch.data(),
                                  B, S, NH, NH, HS);
  expect_close(out_g, out_m, 1e-12, "gqa out");
  expect_close(att_g, att_m, 1e-12, "gqa att");
  Vec want(gqa.size(), 0.0);  // dm folded back into the grouped layout
  for (int bs = 0; bs < B * S; ++bs) {
    for (int h = 0; h < NH; ++h) {
      for (int d = 0; d < HS; ++d) {
        want[bs * Wg + h * HS + d] = dm[bs * Wm + h * HS + d];
        want[bs * Wg + (NH + h / group) * HS + d] += dm[bs * Wm + (NH + h) * HS + d];
        want[bs * Wg + (NH + KVH + h / group) * HS + d] += dm[bs * Wm + (2 * NH + h) * HS + d];
      }
    }
  }
  expect_close(dg, want, 1e-12, "gqa dqkv");
}

void check_attention_float(int KVH, uint64_t seed) {
  SCOPED_TRACE("KVH=" + std::to_string(KVH));
  ScopedThreads threads(2);
  const int B = 2, S = 100, NH = 3, HS = 20;
  const size_t nqkv = static_cast<size_t>(B) * S * (NH + 2 * KVH) * HS;
  const size_t nout = static_cast<size_t>(B) * S * NH * HS;
  const size_t natt = static_cast<size_t>(B) * NH * S * S;
  // |q·k|/√HS up to 16·20/4.5 ≈ 70: peaked rows whose smallest exp() arguments (< −87) reach the
  // clamp of the float kernel's exp.
  const Vec qkv = random_vec(nqkv, seed, -4.0, 4.0), dout = random_vec(nout, seed + 1);
  Vec out(nout), att(natt), dqkv(nqkv, 0.0), scratch(cpu::attention_scratch_elems(S));
  cpu::attention_forward<double>(out.data(), att.data(), qkv.data(), B, S, NH, KVH, HS);
  cpu::attention_backward<double>(dqkv.data(), dout.data(), qkv.data(), att.data(), scratch.data(),
                                  B, S, NH, KVH, HS);
  const auto fqkv = to_float(qkv), fdout = to_float(dout);
  std::vector<float> fout(nout), fatt(natt), fdqkv(nqkv, 0.f),
      fscratch(cpu::attention_scratch_elems(S));
  cpu::attention_forward<float>(fout.data(), fatt.data(), fqkv.data(), B, S, NH, KVH, HS);
  cpu::attention_backward<float>(fdqkv.data(), fdout.data(), fqkv.data(), fatt.data(),
                                 fscratch.data(), B, S, NH, KVH, HS);
  expect_close(fout, out, kFloatAttentionTol, "float attention out");
  expect_close(fatt, att, kFloatAttentionTol, "float attention att");
  expect_close(fdqkv, dqkv, kFloatAttentionTol, "float attention dqkv");
}

TEST(KernelsFloat, AttentionMatchesDouble) {
  check_attention_float(3, 70);  // multi-head
  check_attention_float(1, 72);  // multi-query: dk, dv sum three query heads each
}

TEST(KernelsAttention, ProbabilitiesAreCausalAndNormalised) {
  ScopedThreads threads(2);
  const int B = 2, S = 70, NH = 3, HS = 8;
  const auto qkv = to_float(random_vec(static_cast<size_t>(B) * S * 3 * NH * HS, 80, -3.0, 3.0));
  std::vector<float> out(static_cast<size_t>(B) * S * NH * HS);  // (B, S, NH, HS)
  // Pre-filled with NaN: every entry, masked ones included, must be written.
  std::vector<float> att(static_cast<size_t>(B) * NH * S * S,
                         std::numeric_limits<float>::quiet_NaN());  // (B, NH, S, S)
  cpu::attention_forward<float>(out.data(), att.data(), qkv.data(), B, S, NH, NH, HS);
  for (int bh = 0; bh < B * NH; ++bh) {
    for (int i = 0; i < S; ++i) {
      const float* row = att.data() + (static_cast<size_t>(bh) * S + i) * S;
      double sum = 0;
      for (int j = 0; j <= i; ++j) {
        EXPECT_GE(row[j], 0.f);
        sum += row[j];
      }
      // Float rounding of S ≤ 70 terms near 1: ~70·6e-8.
      EXPECT_NEAR(sum, 1.0, 1e-5) << "bh " << bh << " row " << i;
      for (int j = i + 1; j < S; ++j)
        ASSERT_EQ(row[j], 0.f) << "bh " << bh << " (" << i << "," << j << ")";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE

// The model's angle table (S, HS): row s = [cos(s·f_i) | sin(s·f_i)], f_i = base^(−2i/HS).
Vec rope_table(int S, int HS, double base = 10000.0) {
  const int half = HS / 2;
  Vec cs(static_cast<size_t>(S) * HS);
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < half; ++i) {
      const double theta = s * std::pow(base, -2.0 * i / HS);
      cs[s * HS + i] = std::cos(theta);
      cs[s * HS + half + i] = std::sin(theta);
    }
  }
  return cs;
}

// Hugging Face's apply_rotary_pos_emb from its definition, x·cos + rotate_half(x)·sin with
// rotate_half(x) = [−x2 | x1], angles computed here (not read from a table) so that the table's
// layout is checked too. Value heads are copied.
Vec naive_rope(const Vec& qkv, int B, int S, int NH, int KVH, int HS, double base = 10000.0) {
  const int half = HS / 2, W = (NH + 2 * KVH) * HS;
  Vec out = qkv;
  for (int bs = 0; bs < B * S; ++bs) {
    const int s = bs % S;
    for (int h = 0; h < NH + KVH; ++h) {
      const double* x = &qkv[bs * W + h * HS];
      double* y = &out[bs * W + h * HS];
      for (int d = 0; d < HS; ++d) {
        const int i = d % half;  // the frequency of both halves' element d (HF repeats it)
        const double theta = s * std::pow(base, -2.0 * i / HS);
        const double rotated = d < half ? -x[d + half] : x[d - half];  // rotate_half(x)[d]
        y[d] = x[d] * std::cos(theta) + rotated * std::sin(theta);
      }
    }
  }
  return out;
}

void check_rope(int B, int S, int NH, int KVH, int HS, uint64_t seed) {
  SCOPED_TRACE("rope B=" + std::to_string(B) + " S=" + std::to_string(S) + " NH=" +
               std::to_string(NH) + " KVH=" + std::to_string(KVH) + " HS=" + std::to_string(HS));
  const int W = (NH + 2 * KVH) * HS;
  const size_t n = static_cast<size_t>(B) * S * W;
  const Vec cs = rope_table(S, HS);
  Vec x = random_vec(n, seed);            // (B, S, NH + 2·KVH, HS)
  const Vec r = random_vec(n, seed + 1);  // (B, S, NH + 2·KVH, HS)
  Vec y = x;
  cpu::rope_forward<double>(y.data(), cs.data(), B, S, NH, KVH, HS);
  expect_close(y, naive_rope(x, B, S, NH, KVH, HS), 1e-14, "rope_forward");
  // Value heads and position 0 (cos = 1, sin = 0) are left bit for bit as they were.
  for (int bs = 0; bs < B * S; ++bs) {
    const int first = bs % S == 0 ? 0 : (NH + KVH) * HS;
    for (int j = first; j < W; ++j) ASSERT_EQ(y[bs * W + j], x[bs * W + j]) << bs << ", " << j;
  }

  // The rotation is linear, so L = Σ r ⊙ rope(x) has gradient rope_backward(r).
  Vec buf(n);
  auto loss = [&] {
    buf = x;
    cpu::rope_forward<double>(buf.data(), cs.data(), B, S, NH, KVH, HS);
    return dot(r, buf);
  };
  Vec dx = r;
  cpu::rope_backward<double>(dx.data(), cs.data(), B, S, NH, KVH, HS);
  expect_close(dx, numeric_grad(x, loss), kFdTol, "rope dqkv");

  // Orthogonal: the transpose undoes the forward.
  cpu::rope_backward<double>(y.data(), cs.data(), B, S, NH, KVH, HS);
  expect_close(y, x, 1e-14, "rope_backward(rope_forward(x))");
}

TEST(KernelsGrad, RopeFiniteDifferences) {
  check_rope(2, 5, 4, 4, 6, 210);  // multi-head
  check_rope(2, 5, 4, 2, 6, 211);  // grouped-query
  check_rope(2, 5, 4, 1, 6, 212);  // multi-query
  check_rope(1, 3, 1, 1, 2, 213);  // one pair per head
}

// What RoPE is for: the score of a query at position m with a key at position n depends on
// n − m only. The same q and k vectors are placed at every position, rotated, and each score
// compared with the score at the same offset from position 0.
TEST(KernelsRope, ScoresDependOnRelativePositionOnly) {
  const int S = 12, NH = 2, KVH = 1, HS = 8, W = (NH + 2 * KVH) * HS;
  const Vec cs = rope_table(S, HS);
  const Vec head = random_vec(W, 220);  // one row: (NH + 2·KVH, HS)
  Vec qkv(static_cast<size_t>(S) * W);  // (1, S, NH + 2·KVH, HS)
  for (int s = 0; s < S; ++s) std::copy(head.begin(), head.end(), qkv.begin() + s * W);
  cpu::rope_forward<double>(qkv.data(), cs.data(), 1, S, NH, KVH, HS);
  auto score = [&](int h, int m, int n) {  // query head h at m with the key head at n
    double s = 0;
    for (int d = 0; d < HS; ++d) s += qkv[m * W + h * HS + d] * qkv[n * W + NH * HS + d];
    return s;
  };
  for (int h = 0; h < NH; ++h) {
    for (int m = 0; m < S; ++m) {
      for (int n = 0; n < S; ++n) {
        const int lo = std::min(m, n);  // the same pair shifted back towards position 0
        EXPECT_NEAR(score(h, m, n), score(h, m - lo, n - lo), 1e-12)
            << "head " << h << " (" << m << ", " << n << ")";
      }
    }
  }
}

TEST(KernelsFloat, RopeMatchesDouble) {
  ScopedThreads threads(2);
  const int B = 2, S = 300, NH = 6, KVH = 2, HS = 64;
  const size_t n = static_cast<size_t>(B) * S * (NH + 2 * KVH) * HS;
  const Vec cs = rope_table(S, HS), x = random_vec(n, 230), dy = random_vec(n, 231);
  Vec y = x, dx = dy;
  cpu::rope_forward<double>(y.data(), cs.data(), B, S, NH, KVH, HS);
  cpu::rope_backward<double>(dx.data(), cs.data(), B, S, NH, KVH, HS);
  // The table rounded to float, as the model stores it; that rounding (≤ 6e-8 of each entry) is
  // part of what the tolerance covers.
  const auto fcs = to_float(cs);
  auto fy = to_float(x), fdx = to_float(dy);
  cpu::rope_forward<float>(fy.data(), fcs.data(), B, S, NH, KVH, HS);
  cpu::rope_backward<float>(fdx.data(), fcs.data(), B, S, NH, KVH, HS);
  expect_close(fy, y, kFloatTol, "float rope out");
  expect_close(fdx, dx, kFloatTol, "float rope dqkv");
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(KernelsGrad, EmbeddingFiniteDifferences) {
  const int B = 2, S = 3, C = 4, V = 5;
  // Tokens with repeats, so the scatter must add rather than overwrite.
  const std::vector<int32_t> tokens = {1, 3, 1, 4, 1, 0};  // (B, S)
  Vec wte = random_vec(V * C, 90);                         // (V, C)
  Vec wpe = random_vec(S * C, 91);                         // (S, C)
  const Vec r = random_vec(B * S * C, 92);                 // (B, S, C)
  Vec out(B * S * C);                                      // (B, S, C)
  auto loss = [&] {
    cpu::embedding_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), B, S, C, 0,
                                   V);
    return dot(r, out);
  };
  loss();
  for (int bs = 0; bs < B * S; ++bs) {
    for (int c = 0; c < C; ++c) {
      EXPECT_EQ(out[bs * C + c], wte[tokens[bs] * C + c] + wpe[(bs % S) * C + c]);
    }
  }
  const Vec dwte0 = random_vec(V * C, 93), dwpe0 = random_vec(S * C, 94);
  Vec dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_backward<double>(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, S, C, 0, V);
  expect_close(minus(dwte, dwte0), numeric_grad(wte, loss), kFdTol, "embedding dwte");
  expect_close(minus(dwpe, dwpe0), numeric_grad(wpe, loss), kFdTol, "embedding dwpe");
}

TEST(KernelsEmbedding, VocabShardsSumToUnsharded) {
  ScopedThreads threads(2);
  const int B = 3, S = 7, C = 70, V = 13, split = 6;    // shards [0, 6) and [6, 13)
  const auto tokens = random_tokens(B * S, 100, 0, V);  // (B, S)
  const auto wte = to_float(random_vec(V * C, 101));    // (V, C)
  const auto wpe = to_float(random_vec(S * C, 102));    // (S, C)
  // Unsharded, against the definition.
  std::vector<float> full(B * S * C);  // (B, S, C)
  cpu::embedding_forward<float>(full.data(), tokens.data(), wte.data(), wpe.data(), B, S, C, 0, V);
  Vec want(B * S * C);
  for (int bs = 0; bs < B * S; ++bs) {
    for (int c = 0; c < C; ++c) {
      want[bs * C + c] = double(wte[tokens[bs] * C + c] + wpe[(bs % S) * C + c]);
    }
  }
  expect_close(full, want, 0.0, "embedding unsharded");
  // Shard 0 adds wpe, shard 1 passes null (as one rank of a tensor group would).
  std::vector<float> out0(B * S * C), out1(B * S * C);  // (B, S, C) each
  cpu::embedding_forward<float>(out0.data(), tokens.data(), wte.data(), wpe.data(), B, S, C, 0,
                                split);
  cpu::embedding_forward<float>(out1.data(), tokens.data(), wte.data() + split * C, nullptr, B, S,
                                C, split, V - split);
  std::vector<float> sum(B * S * C);
  cpu::add<float>(sum.data(), out0.data(), out1.data(), sum.size());
  expect_close(sum, want, 0.0, "embedding shard sum");  // one of the two terms is exactly 0

  // Backward: the shards' dwte, laid side by side, equal the unsharded dwte.
  const auto dout = to_float(random_vec(B * S * C, 103));  // (B, S, C)
  std::vector<float> dwte(V * C, 0.f), dwpe(S * C, 0.f);   // (V, C), (S, C)
  cpu::embedding_backward<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, S, C, 0,
                                 V);
  std::vector<float> dwte_sharded(V * C, 0.f);  // (V, C): shard 0 rows, then shard 1 rows
  cpu::embedding_backward<float>(dwte_sharded.data(), nullptr, dout.data(), tokens.data(), B, S, C,
                                 0, split);
  cpu::embedding_backward<float>(dwte_sharded.data() + split * C, nullptr, dout.data(),
                                 tokens.data(), B, S, C, split, V - split);
  Vec want_dwte(V * C, 0.0), want_dwpe(S * C, 0.0);
  for (int bs = 0; bs < B * S; ++bs) {
    for (int c = 0; c < C; ++c) {
      want_dwte[tokens[bs] * C + c] += dout[bs * C + c];
      want_dwpe[(bs % S) * C + c] += dout[bs * C + c];
    }
  }
  // At most B·S float additions per element.
  expect_close(dwte, want_dwte, 1e-6, "embedding dwte");
  expect_close(dwte_sharded, want_dwte, 1e-6, "embedding dwte from shards");
  expect_close(dwpe, want_dwpe, 1e-6, "embedding dwpe");
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

// The header's four steps for one shard-less call: losses (N).
template <class T>
std::vector<T> ce_forward(const std::vector<T>& logits, const std::vector<int32_t>& targets, int N,
                          int ld, int valid, std::vector<T>* row_max = nullptr,
                          std::vector<T>* row_sumexp = nullptr) {
  std::vector<T> mx(N), se(N), tl(N), losses(N);
  cpu::ce_row_max<T>(mx.data(), logits.data(), N, ld, valid);
  cpu::ce_row_sumexp<T>(se.data(), logits.data(), mx.data(), N, ld, valid);
  cpu::ce_target_logit<T>(tl.data(), logits.data(), targets.data(), N, ld, 0, valid);
  cpu::ce_losses<T>(losses.data(), mx.data(), se.data(), tl.data(), nullptr, N);
  if (row_max != nullptr) *row_max = mx;
  if (row_sumexp != nullptr) *row_sumexp = se;
  return losses;
}

// Naive log-softmax loss per row, straight from the definition (valid columns only).
Vec naive_ce(const Vec& logits, const std::vector<int32_t>& targets, int N, int ld, int valid) {
  Vec losses(N);
  for (int n = 0; n < N; ++n) {
    double z = 0;
    for (int j = 0; j < valid; ++j) z += std::exp(logits[n * ld + j]);
    losses[n] = std::log(z) - logits[n * ld + targets[n]];
  }
  return losses;
}

TEST(KernelsGrad, CrossEntropyFiniteDifferences) {
  const int N = 4, valid = 7, ld = 9;               // two padding columns per row
  Vec logits = random_vec(N * ld, 110, -3.0, 3.0);  // (N, ld)
  for (int n = 0; n < N; ++n) {
    // Padding holds large values: were it included, it would dominate the softmax.
    for (int j = valid; j < ld; ++j) logits[n * ld + j] = 50.0;
  }
  const std::vector<int32_t> targets = {0, 6, 3, 3};  // (N)
  auto loss = [&] {
    const Vec losses = ce_forward<double>(logits, targets, N, ld, valid);
    double s = 0;
    for (double l : losses) s += l;
    return s / N;
  };
  expect_close(ce_forward<double>(logits, targets, N, ld, valid),
               naive_ce(logits, targets, N, ld, valid), 1e-12, "ce losses");

  Vec mx, se;
  ce_forward<double>(logits, targets, N, ld, valid, &mx, &se);
  // ce_backward assigns: NaN in, finite values (and exact zeros on padding) out.
  Vec dlogits(N * ld, std::numeric_limits<double>::quiet_NaN());  // (N, ld)
  cpu::ce_backward<double>(dlogits.data(), logits.data(), mx.data(), se.data(), targets.data(),
                           nullptr, 1.0 / N, N, ld, 0, valid);
  for (int n = 0; n < N; ++n) {
    for (int j = valid; j < ld; ++j) EXPECT_EQ(dlogits[n * ld + j], 0.0);
  }
  // Finite differences over every column, padding included (whose true gradient is 0).
  expect_close(dlogits, numeric_grad(logits, loss), kFdTol, "ce dlogits");
}

TEST(KernelsFloat, CrossEntropyMatchesDouble) {
  ScopedThreads threads(2);
  const int N = 50, valid = 300, ld = 320;
  // Logit differences up to 100: the float kernel's exp clamps arguments below −87.
  const Vec logits = random_vec(N * ld, 120, -50.0, 50.0);  // (N, ld)
  const auto targets = random_tokens(N, 121, 0, valid);     // (N)
  Vec mx, se;
  const Vec losses = ce_forward<double>(logits, targets, N, ld, valid, &mx, &se);
  Vec dlogits(N * ld);
  cpu::ce_backward<double>(dlogits.data(), logits.data(), mx.data(), se.data(), targets.data(),
                           nullptr, 1.0 / N, N, ld, 0, valid);
  const auto flogits = to_float(logits);
  std::vector<float> fmx, fse;
  const auto flosses = ce_forward<float>(flogits, targets, N, ld, valid, &fmx, &fse);
  std::vector<float> fdlogits(N * ld);
  cpu::ce_backward<float>(fdlogits.data(), flogits.data(), fmx.data(), fse.data(), targets.data(),
                          nullptr, 1.0f / N, N, ld, 0, valid);
  expect_close(flosses, losses, kFloatTol, "float ce losses");
  expect_close(fdlogits, dlogits, kFloatTol, "float ce dlogits");
}

TEST(KernelsFloat, ExpInsideKernelsIsAccurate) {
  // The float kernels evaluate exp without libm (to vectorise). With one column per row and
  // row_max = 0, ce_row_sumexp returns exp(logit) itself, so its accuracy can be measured
  // pointwise against double libm over the whole range it claims, |x| ≤ 87.
  const int N = 200001;
  std::vector<float> x(N), zero(N, 0.f), e(N);  // (N) each
  for (int n = 0; n < N; ++n) x[n] = static_cast<float>(-87.0 + 174.0 * n / (N - 1));
  cpu::ce_row_sumexp<float>(e.data(), x.data(), zero.data(), N, 1, 1);
  double worst = 0;
  for (int n = 0; n < N; ++n) {
    const double want = std::exp(static_cast<double>(x[n]));
    worst = std::max(worst, std::fabs(e[n] - want) / want);
  }
  // 3e-7 ≈ 5 ulp of float; the polynomial and range reduction measure 1.4 ulp.
  EXPECT_LT(worst, 3e-7);
}

TEST(KernelsCrossEntropy, PaddingColumnsChangeNothing) {
  const int N = 6, valid = 11, ld = 16;
  const Vec base = random_vec(N * valid, 130, -4.0, 4.0);  // (N, valid)
  const auto targets = random_tokens(N, 131, 0, valid);    // (N)
  std::vector<float> tight = to_float(base);               // (N, valid)
  std::vector<float> padded(N * ld, 1e4f);                 // (N, ld), padding huge
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < valid; ++j) padded[n * ld + j] = tight[n * valid + j];
  }
  std::vector<float> mx_t, se_t, mx_p, se_p;
  const auto loss_t = ce_forward<float>(tight, targets, N, valid, valid, &mx_t, &se_t);
  const auto loss_p = ce_forward<float>(padded, targets, N, ld, valid, &mx_p, &se_p);
  std::vector<float> d_t(N * valid), d_p(N * ld);
  cpu::ce_backward<float>(d_t.data(), tight.data(), mx_t.data(), se_t.data(), targets.data(),
                          nullptr, 0.5f, N, valid, 0, valid);
  cpu::ce_backward<float>(d_p.data(), padded.data(), mx_p.data(), se_p.data(), targets.data(),
                          nullptr, 0.5f, N, ld, 0, valid);
  // Same numbers summed in the same order: bitwise equal.
  for (int n = 0; n < N; ++n) {
    EXPECT_EQ(loss_t[n], loss_p[n]) << "row " << n;
    for (int j = 0; j < valid; ++j) EXPECT_EQ(d_t[n * valid + j], d_p[n * ld + j]);
    for (int j = valid; j < ld; ++j) EXPECT_EQ(d_p[n * ld + j], 0.f);
  }
}

TEST(KernelsCrossEntropy, VocabShardsMatchUnsharded) {
  // Two ranks of a tensor group: shard 0 holds columns [0, 6), shard 1 columns [6, 11) padded to
  // 6 columns, as a vocab that does not divide the group size would be.
  const int N = 5, V = 11, split = 6, ld1 = 6, valid1 = V - split;
  const Vec full = random_vec(N * V, 140, -5.0, 5.0);          // (N, V)
  std::vector<int32_t> targets = random_tokens(N, 141, 0, V);  // (N)
  targets[0] = 0;                                              // first column of shard 0
  targets[1] = V - 1;                                          // last real column of shard 1
  Vec s0(N * split), s1(N * ld1, 99.0);  // (N, split), (N, ld1) with padding 99
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < split; ++j) s0[n * split + j] = full[n * V + j];
    for (int j = 0; j < valid1; ++j) s1[n * ld1 + j] = full[n * V + split + j];
  }
  // 1. Each shard's row max and Σexp against its own max (the model's one pass per shard).
  Vec m0(N), m1(N), e0(N), e1(N);
  cpu::ce_row_max<double>(m0.data(), s0.data(), N, split, split);
  cpu::ce_row_max<double>(m1.data(), s1.data(), N, ld1, valid1);
  cpu::ce_row_sumexp<double>(e0.data(), s0.data(), m0.data(), N, split, split);
  cpu::ce_row_sumexp<double>(e1.data(), s1.data(), m1.data(), N, ld1, valid1);
  // 2. The max all-reduced with max; each shard's sum rescaled to it, then all-reduced with sum.
  Vec mx(N), se(N);
  for (int n = 0; n < N; ++n) mx[n] = std::max(m0[n], m1[n]);
  cpu::ce_rescale_sumexp<double>(e0.data(), m0.data(), mx.data(), N);
  cpu::ce_rescale_sumexp<double>(e1.data(), m1.data(), mx.data(), N);
  for (int n = 0; n < N; ++n) se[n] = e0[n] + e1[n];
  // 3. target logit, all-reduced with sum (exactly one shard owns each target).
  Vec t0(N), t1(N), tl(N);
  cpu::ce_target_logit<double>(t0.data(), s0.data(), targets.data(), N, split, 0, split);
  cpu::ce_target_logit<double>(t1.data(), s1.data(), targets.data(), N, ld1, split, valid1);
  for (int n = 0; n < N; ++n) tl[n] = t0[n] + t1[n];
  Vec losses(N);
  cpu::ce_losses<double>(losses.data(), mx.data(), se.data(), tl.data(), nullptr, N);
  expect_close(losses, naive_ce(full, targets, N, V, V), 1e-12, "sharded ce losses");

  // Backward per shard, against softmax − onehot of the full row.
  const double scale = 0.25;
  Vec d0(N * split), d1(N * ld1);
  cpu::ce_backward<double>(d0.data(), s0.data(), mx.data(), se.data(), targets.data(), nullptr,
                           scale, N, split, 0, split);
  cpu::ce_backward<double>(d1.data(), s1.data(), mx.data(), se.data(), targets.data(), nullptr,
                           scale, N, ld1, split, valid1);
  Vec got(N * V), want(N * V);
  for (int n = 0; n < N; ++n) {
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(full[n * V + j]);
    for (int j = 0; j < V; ++j) {
      want[n * V + j] = scale * (std::exp(full[n * V + j]) / z - (j == targets[n] ? 1.0 : 0.0));
      got[n * V + j] = j < split ? d0[n * split + j] : d1[n * ld1 + j - split];
    }
    for (int j = valid1; j < ld1; ++j) EXPECT_EQ(d1[n * ld1 + j], 0.0);
  }
  expect_close(got, want, 1e-12, "sharded ce dlogits");
}

// The loss mask as per-row weights, against the unweighted kernels run one row at a time and
// scaled by hand. Rows 2 and 4 weigh 0 and hold a NaN logit, and +inf and −inf logits with the
// target −100 (PyTorch's ignore_index): their losses and gradient rows must be exactly 0, as an
// ignored position is ignored. Tolerance 1e-6 relative: the kernel multiplies w · (loss) and
// (w · scale) · (softmax − onehot), the hand w · (loss) and w · (scale · (softmax − onehot)),
// two float roundings apart (≤ 2.4e-7 relative).
TEST(KernelsCrossEntropy, WeightsScaleRowsAndZeroWeightIgnoresTheRow) {
  const int N = 6, valid = 11, ld = 16, vocab_start = 0;
  const float scale = 0.125f;
  std::vector<float> logits = to_float(random_vec(N * ld, 150, -4.0, 4.0));  // (N, ld)
  std::vector<int32_t> targets = random_tokens(N, 151, 0, valid);            // (N)
  const std::vector<float> weights = {1.f, 0.5f, 0.f, 2.f, 0.f, 0.25f};      // (N)
  logits[2 * ld + 3] = std::numeric_limits<float>::quiet_NaN();
  logits[4 * ld + 1] = std::numeric_limits<float>::infinity();
  logits[4 * ld + 5] = -std::numeric_limits<float>::infinity();
  targets[4] = -100;
  std::vector<float> mx, se;
  ce_forward<float>(logits, targets, N, ld, valid, &mx, &se);
  std::vector<float> tl(N);
  cpu::ce_target_logit<float>(tl.data(), logits.data(), targets.data(), N, ld, vocab_start, valid);
  // The masked rows' unweighted losses are not finite: what the weights must keep out.
  std::vector<float> unweighted(N);
  cpu::ce_losses<float>(unweighted.data(), mx.data(), se.data(), tl.data(), nullptr, N);
  EXPECT_FALSE(std::isfinite(unweighted[2]));
  EXPECT_FALSE(std::isfinite(unweighted[4]));

  std::vector<float> losses(N, NAN);
  cpu::ce_losses<float>(losses.data(), mx.data(), se.data(), tl.data(), weights.data(), N);
  std::vector<float> dlogits(N * ld, NAN);  // (N, ld): NaN shows any element left unassigned
  cpu::ce_backward<float>(dlogits.data(), logits.data(), mx.data(), se.data(), targets.data(),
                          weights.data(), scale, N, ld, vocab_start, valid);
  Vec want_loss(N, 0.0), want_d(N * ld, 0.0);
  for (int n = 0; n < N; ++n) {
    if (weights[n] == 0.f) {
      EXPECT_EQ(losses[n], 0.f) << "row " << n;
      for (int j = 0; j < ld; ++j)
        EXPECT_EQ(dlogits[n * ld + j], 0.f) << "row " << n << " col " << j;
      continue;
    }
    float l = NAN;  // the unweighted kernels on this row alone
    cpu::ce_losses<float>(&l, &mx[n], &se[n], &tl[n], nullptr, 1);
    std::vector<float> d(ld, NAN);
    cpu::ce_backward<float>(d.data(), &logits[n * ld], &mx[n], &se[n], &targets[n], nullptr, scale,
                            1, ld, vocab_start, valid);
    want_loss[n] = static_cast<double>(weights[n]) * l;
    for (int j = 0; j < ld; ++j) want_d[n * ld + j] = static_cast<double>(weights[n]) * d[j];
  }
  expect_close(losses, want_loss, 1e-6, "weighted ce losses");
  expect_close(dlogits, want_d, 1e-6, "weighted ce dlogits");

  // All weights 1: the unweighted results bit for bit (w · x is x exactly), so an all-ones mask
  // trains as no mask does.
  const std::vector<int32_t> finite_targets = random_tokens(N, 152, 0, valid);
  const std::vector<float> clean = to_float(random_vec(N * ld, 153, -4.0, 4.0));
  const std::vector<float> ones(N, 1.f);
  ce_forward<float>(clean, finite_targets, N, ld, valid, &mx, &se);
  cpu::ce_target_logit<float>(tl.data(), clean.data(), finite_targets.data(), N, ld, 0, valid);
  std::vector<float> l0(N), l1(N), d0(N * ld), d1(N * ld);
  cpu::ce_losses<float>(l0.data(), mx.data(), se.data(), tl.data(), nullptr, N);
  cpu::ce_losses<float>(l1.data(), mx.data(), se.data(), tl.data(), ones.data(), N);
  cpu::ce_backward<float>(d0.data(), clean.data(), mx.data(), se.data(), finite_targets.data(),
                          nullptr, scale, N, ld, 0, valid);
  cpu::ce_backward<float>(d1.data(), clean.data(), mx.data(), se.data(), finite_targets.data(),
                          ones.data(), scale, N, ld, 0, valid);
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(d0, d1);
}

// d(Σ w_n · loss_n · scale)/d(logits) by central differences of the double forward, against the
// weighted backward; the zero-weight row's gradient is 0 on both sides (its loss is constant).
TEST(KernelsGrad, WeightedCrossEntropyFiniteDifferences) {
  const int N = 5, valid = 7, ld = 9;
  Vec logits = random_vec(N * ld, 160, -3.0, 3.0);  // (N, ld)
  for (int n = 0; n < N; ++n) {
    for (int j = valid; j < ld; ++j) logits[n * ld + j] = 50.0;  // padding, excluded
  }
  const std::vector<int32_t> targets = {0, 6, 3, 3, 2};  // (N)
  const Vec weights = {1.0, 0.0, 0.5, 3.0, 1.0};         // (N)
  const double scale = 1.0 / 4;                          // 1 / Σ of the counted rows' ones
  auto weighted_loss = [&] {
    Vec mx(N), se(N), tl(N), losses(N);
    cpu::ce_row_max<double>(mx.data(), logits.data(), N, ld, valid);
    cpu::ce_row_sumexp<double>(se.data(), logits.data(), mx.data(), N, ld, valid);
    cpu::ce_target_logit<double>(tl.data(), logits.data(), targets.data(), N, ld, 0, valid);
    cpu::ce_losses<double>(losses.data(), mx.data(), se.data(), tl.data(), weights.data(), N);
    double s = 0;
    for (double l : losses) s += l;
    return s * scale;
  };
  Vec mx, se;
  ce_forward<double>(logits, targets, N, ld, valid, &mx, &se);
  Vec dlogits(N * ld, kNaN);  // (N, ld)
  cpu::ce_backward<double>(dlogits.data(), logits.data(), mx.data(), se.data(), targets.data(),
                           weights.data(), scale, N, ld, 0, valid);
  for (int j = 0; j < ld; ++j) EXPECT_EQ(dlogits[1 * ld + j], 0.0) << "zero-weight row, col " << j;
  expect_close(dlogits, numeric_grad(logits, weighted_loss), kFdTol, "weighted ce dlogits");
}

// ---------------------------------------------------------------------------------------------
// AdamW and vector helpers

TEST(KernelsAdamW, ConstantGradientClosedForm) {
  // With a constant gradient g the bias-corrected moments are exactly mhat = g, vhat = g², so
  // each step is p ← (1 − lr·wd)·p − lr·g/(|g| + eps), which unrolls to
  // p_t = a^t·p0 − c·(1 − a^t)/(1 − a) with a = 1 − lr·wd, c = lr·g/(|g| + eps).
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.0f};  // (n)
  const std::vector<float> g = {0.3f, -2.0f, 1e-3f, 5.0f};
  const std::vector<float> p0 = p;
  std::vector<float> m(p.size(), 0.f), v(p.size(), 0.f);
  for (int t = 1; t <= 3; ++t) {
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), p.size(), lr, b1, b2, eps, wd, t,
                      1.f);
    const double a = 1.0 - double(lr) * wd;
    for (size_t i = 0; i < p.size(); ++i) {
      const double c = double(lr) * g[i] / (std::fabs(double(g[i])) + eps);
      const double want = std::pow(a, t) * p0[i] - c * (1 - std::pow(a, t)) / (1 - a);
      // float: a few ulp per step of values ~1 (the bias corrections lose ~1e-7 each).
      EXPECT_NEAR(p[i], want, 1e-6) << "step " << t << " param " << i;
    }
  }
}

TEST(KernelsAdamW, GradScaleIsTheScaledGradient) {
  // Clipping scales the gradients inside the update: the same step, bit for bit, as one on
  // gradients scaled beforehand (one float product either way), and the gradients unchanged.
  const std::vector<float> g0 = {0.3f, -2.0f, 1e-3f, 5.0f, -0.7f};
  for (const float s : {1.f, 0.37f, 1e-3f}) {
    std::vector<float> g = g0, g_scaled = g0;
    for (float& x : g_scaled) x *= s;
    std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f}, m(p.size(), 0.1f), v(p.size(), 0.2f);
    std::vector<float> p2 = p, m2 = m, v2 = v;
    for (int t = 1; t <= 2; ++t) {
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), p.size(), 0.01f, 0.9f, 0.95f, 1e-8f,
                        0.1f, t, s);
      cpu::adamw_update(p2.data(), g_scaled.data(), m2.data(), v2.data(), p2.size(), 0.01f, 0.9f,
                        0.95f, 1e-8f, 0.1f, t, 1.f);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(p[i], p2[i]) << "scale " << s << " param " << i;
      EXPECT_EQ(m[i], m2[i]) << "scale " << s << " m " << i;
      EXPECT_EQ(v[i], v2[i]) << "scale " << s << " v " << i;
      EXPECT_EQ(g[i], g0[i]) << "scale " << s << " gradient " << i << " changed";
    }
  }
}

TEST(KernelsAdamW, VaryingGradientUnrolledMoments) {
  // m_t = (1−β1)·Σ_k β1^(t−k)·g_k and v_t = (1−β2)·Σ_k β2^(t−k)·g_k², unrolled by hand for
  // three steps; the parameter follows from the moments of each step.
  const float lr = 0.05f, b1 = 0.8f, b2 = 0.9f, eps = 1e-6f, wd = 0.2f;
  const std::vector<std::vector<float>> grads = {{1.0f, -0.5f}, {0.25f, 2.0f}, {-1.0f, 0.0f}};
  std::vector<float> p = {1.0f, -2.0f}, m(2, 0.f), v(2, 0.f);
  std::vector<double> want_p = {1.0, -2.0};
  for (int t = 1; t <= 3; ++t) {
    cpu::adamw_update(p.data(), grads[t - 1].data(), m.data(), v.data(), 2, lr, b1, b2, eps, wd, t,
                      1.f);
    for (int i = 0; i < 2; ++i) {
      double mt = 0, vt = 0;
      for (int k = 1; k <= t; ++k) {
        const double gk = grads[k - 1][i];
        mt += (1 - double(b1)) * std::pow(double(b1), t - k) * gk;
        vt += (1 - double(b2)) * std::pow(double(b2), t - k) * gk * gk;
      }
      const double mhat = mt / (1 - std::pow(double(b1), t));
      const double vhat = vt / (1 - std::pow(double(b2), t));
      want_p[i] -= double(lr) * (mhat / (std::sqrt(vhat) + eps) + double(wd) * want_p[i]);
      EXPECT_NEAR(m[i], mt, 1e-6) << "m, step " << t;
      EXPECT_NEAR(v[i], vt, 1e-6) << "v, step " << t;
      EXPECT_NEAR(p[i], want_p[i], 1e-5) << "param, step " << t;
    }
  }
}

TEST(KernelsVector, HelpersMatchDefinitions) {
  ScopedThreads threads(2);
  const size_t n = 1001;
  const auto a = to_float(random_vec(n, 150)), b = to_float(random_vec(n, 151));
  std::vector<float> out(n), y = a;
  cpu::add<float>(out.data(), a.data(), b.data(), n);
  cpu::add_inplace<float>(y.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], a[i] + b[i]);
    EXPECT_EQ(y[i], a[i] + b[i]);
  }
  cpu::scale_inplace<float>(y.data(), 0.5f, n);  // halving is exact in binary
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(y[i], (a[i] + b[i]) * 0.5f);
  // Σ i² for i = 1..n = n(n+1)(2n+1)/6; every term and partial sum is exact in double.
  std::vector<float> ramp(n);
  for (size_t i = 0; i < n; ++i) ramp[i] = float(i + 1);
  EXPECT_EQ(cpu::sum_squares<float>(ramp.data(), n), double(n) * (n + 1) * (2 * n + 1) / 6);
}

// The core each feature set chooses: the OpenBLAS core whose kernels need exactly those
// instructions (kernels/cpu/blas.cc).
TEST(Blas, CoreFollowsTheFeatures) {
  using F = cpu::X86Features;
  EXPECT_EQ(cpu::blas_core_for(F{true, true, true, true}), "Cooperlake");
  EXPECT_EQ(cpu::blas_core_for(F{true, true, true, false}), "SkylakeX");
  EXPECT_EQ(cpu::blas_core_for(F{true, true, false, false}), "Haswell");
  EXPECT_EQ(cpu::blas_core_for(F{true, false, false, false}), "Sandybridge");
  EXPECT_EQ(cpu::blas_core_for(F{}), "");
}

// cpuid and xgetbv against the kernel's view: /proc/cpuinfo lists a feature only when the CPU has
// it and the kernel enabled its register state.
TEST(Blas, FeaturesAgreeWithProcCpuinfo) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "not x86-64: the CPU features are not read there";
#endif
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  auto has = [&](const char* f) {
    return flags.find(std::string(" ") + f + " ") != std::string::npos;
  };
  const cpu::X86Features f = cpu::x86_features();
  EXPECT_EQ(f.avx, has("avx")) << flags;
  EXPECT_EQ(f.avx2_fma, has("avx2") && has("fma")) << flags;
  EXPECT_EQ(f.avx512, has("avx2") && has("fma") && has("avx512f") && has("avx512cd") &&
                          has("avx512bw") && has("avx512dq") && has("avx512vl"))
      << flags;
  EXPECT_EQ(f.avx512_bf16, f.avx512 && has("avx512_bf16")) << flags;
}

// The loaded library runs the features' core, or the one OPENBLAS_CORETYPE names, and the
// variable is as the process was given it.
TEST(Blas, LoadedCoreIsTheChosenOne) {
  const cpu::BlasInfo& info = cpu::blas_info();
  EXPECT_FALSE(info.version.empty());
  EXPECT_TRUE(info.parallel == "openmp" || info.parallel == "pthread" || info.parallel == "serial")
      << info.parallel;
  const char* variable = std::getenv("OPENBLAS_CORETYPE");
  if (variable != nullptr && *variable != '\0') {
    EXPECT_EQ(info.chosen_by, "OPENBLAS_CORETYPE");
    return;
  }
  const std::string wanted = cpu::blas_core_for(cpu::x86_features());
  if (wanted.empty()) {
    EXPECT_EQ(info.chosen_by, "OpenBLAS");
  } else {
    EXPECT_EQ(info.chosen_by, "the CPU's features") << info.core;
    EXPECT_EQ(strcasecmp(info.core.c_str(), wanted.c_str()), 0) << info.core << " vs " << wanted;
  }
  EXPECT_EQ(cpu::blas_summary(), "OpenBLAS " + info.version + " " + info.core);
}

// The kernels compiled once per vector width (STRATA_CPU_CLONES, kernels/cpu/util.h) give the bits
// of the scalar formula, evaluated here one element at a time on the baseline instructions: each
// element goes through the same correctly rounded operations (no FMA, -ffp-contract=off), so the
// CPU a run lands on cannot change its results. Inputs span the exp's saturation.
TEST(KernelsClones, WideVectorsGiveTheScalarBits) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the kernels are compiled once per vector width on x86-64 only";
#endif
  auto float_bits = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
  };
  const int N = 7, F = 37;  // odd sizes: the vector loops' remainders too
  std::vector<float> gate_up(size_t(N) * 2 * F), out(size_t(N) * F);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (auto& x : gate_up) x = dist(gen) * (dist(gen) > 0 ? 1.0f : 0.05f);
  cpu::swiglu_forward<float>(out.data(), gate_up.data(), N, F);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < F; ++i) {
      const float g = gate_up[size_t(n) * 2 * F + i], up = gate_up[size_t(n) * 2 * F + F + i];
      const float e = cpu::exp_fast(-std::fabs(g));
      const float y = g * ((g >= 0.0f ? 1.0f : e) / (1.0f + e)) * up;
      ASSERT_EQ(float_bits(out[size_t(n) * F + i]), float_bits(y)) << n << "," << i;
    }
  const size_t n = gate_up.size();
  std::vector<float> gelu(n);
  cpu::gelu_forward<float>(gelu.data(), gate_up.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const float x = gate_up[i];
    const float y =
        x / (1.0f + cpu::exp_fast(-2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x)));
    ASSERT_EQ(float_bits(gelu[i]), float_bits(y)) << i;
  }
  std::vector<float> param(gate_up), m(n, 0.01f), v(n, 0.02f), grad(n);
  for (size_t i = 0; i < n; ++i) grad[i] = gate_up[(i * 7) % n] * 0.01f;
  const std::vector<float> p0 = param, m0 = m, v0 = v;
  cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f,
                    0.1f, 3, 0.5f);
  const float bc1 = float(1.0 - std::pow(0.9, 3)), bc2 = float(1.0 - std::pow(0.95, 3));
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * 0.5f;
    const float mi = 0.9f * m0[i] + (1.0f - 0.9f) * g;
    const float vi = 0.95f * v0[i] + (1.0f - 0.95f) * g * g;
    const float p = p0[i] - 3e-3f * ((mi / bc1) / (std::sqrt(vi / bc2) + 1e-8f) + 0.1f * p0[i]);
    ASSERT_EQ(float_bits(m[i]), float_bits(mi)) << i;
    ASSERT_EQ(float_bits(v[i]), float_bits(vi)) << i;
    ASSERT_EQ(float_bits(param[i]), float_bits(p)) << i;
  }
}

TEST(KernelsThreads, SetNumThreadsIsVisible) {
  {
    ScopedThreads threads(2);
    EXPECT_EQ(cpu::num_threads(), 2);
    EXPECT_EQ(cpu::attention_scratch_elems(9), 2u * 81u);
  }
  const std::string mode = cpu::blas_parallel_mode();
  EXPECT_TRUE(mode == "openmp" || mode == "pthread" || mode == "serial") << mode;
}

}  // namespace
