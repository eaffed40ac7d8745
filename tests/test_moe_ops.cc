// test_moe_ops.cc — the mixture-of-experts ops of runtime/backend/backend.h on the CPU backend
// (and their kernels, kernels/cpu/moe.h) against references written here in double that share no
// code with them: the softmax and top-k by sorting, the backward by central finite differences
// of the double kernels' forward, the dispatch plan by counting ranks, the permutations and the
// grouped GEMM by plain loops; bf16 operands against the f32 ops on the same (rounded) values;
// and the refusals of misshapen operands.
//
// Tolerances:
//   kFdTol = 1e-7 relative to the largest |gradient|: the routing weights and probabilities are
//     smooth in the logits away from a change of the top-k set (random logits are far from one:
//     a step of 1e-5 never crosses), so the central difference errs by ~h²·|L'''| + ε·|L|/h ≈
//     1e-10; the permutations are linear, so it is exact up to rounding.
//   kF32Tol = 1e-5 relative: the f32 ops against double references, sums of at most a few
//     hundred terms of magnitude ≤ a few (~√K·6e-8 in practice).
//   kBf16Tol = 1e-2 relative: a bf16 result is one rounding (2^-9) of an f32 sum of bf16 inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/moe.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"
#include "tests/backend_test_util.h"

namespace strata {
namespace {

namespace cpu = kernels::cpu;
using backend_test::expect_close;
using backend_test::get;
using backend_test::put;
using backend_test::put_i32;
using backend_test::random;

constexpr double kFdStep = 1e-5;
constexpr double kFdTol = 1e-7;
constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;
constexpr MemCategory kAct = MemCategory::kActivations;

std::unique_ptr<Backend> cpu_backend() {
  return make_backend("cpu", 2);
}

std::vector<int32_t> get_i32(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// ---- references ----------------------------------------------------------------------------

struct RouteRef {
  std::vector<double> probs, w;  // (N, E), (N, k)
  std::vector<int32_t> idx;      // (N, k)
};

// Softmax in double, then a stable sort of the experts by descending probability: equal ones
// keep their index order, the lower first.
RouteRef route_reference(const std::vector<float>& logits, int N, int E, int k, bool renormalize) {
  RouteRef r;
  r.probs.resize(static_cast<size_t>(N) * E);
  for (int n = 0; n < N; ++n) {
    const float* x = &logits[static_cast<size_t>(n) * E];
    const double mx = *std::max_element(x, x + E);
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(x[e] - mx);
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) r.probs[static_cast<size_t>(n) * E + e] = std::exp(x[e] - mx) / s;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
    double sel = 0;
    for (int j = 0; j < k; ++j) sel += r.probs[static_cast<size_t>(n) * E + order[j]];
    for (int j = 0; j < k; ++j) {
      const double p = r.probs[static_cast<size_t>(n) * E + order[j]];
      r.idx.push_back(order[j]);
      r.w.push_back(renormalize ? p / sel : p);
    }
  }
  return r;
}

struct PlanRef {
  std::vector<int32_t> dest, counts, routed;
};

// The plan by definition: an assignment of expert e is kept when fewer than `capacity` others of
// e beat it (a larger weight, or an equal one at a lower flat index); its row is offset_e plus
// the number of kept assignments of e before it in flat order.
PlanRef plan_reference(const std::vector<int32_t>& idx, const std::vector<float>& w, int N, int k,
                       int E, int64_t capacity) {
  const int A = N * k;
  PlanRef p;
  p.routed.assign(E, 0);
  for (int a = 0; a < A; ++a) ++p.routed[idx[a]];
  std::vector<char> kept(A, 1);
  if (capacity >= 0)
    for (int a = 0; a < A; ++a) {
      int64_t beaten_by = 0;
      for (int b = 0; b < A; ++b)
        if (idx[b] == idx[a] && (w[b] > w[a] || (w[b] == w[a] && b < a))) ++beaten_by;
      kept[a] = beaten_by < capacity;
    }
  p.counts.assign(E, 0);
  for (int a = 0; a < A; ++a) p.counts[idx[a]] += kept[a];
  std::vector<int32_t> offset(E, 0);
  for (int e = 1; e < E; ++e) offset[e] = offset[e - 1] + p.counts[e - 1];
  p.dest.assign(A, -1);
  for (int a = 0; a < A; ++a) {
    if (!kept[a]) continue;
    int before = 0;
    for (int b = 0; b < a; ++b) before += idx[b] == idx[a] && kept[b];
    p.dest[a] = offset[idx[a]] + before;
  }
  return p;
}

// Random top-k choices: k distinct experts per token.
std::vector<int32_t> random_choices(int N, int k, int E, uint64_t key) {
  std::vector<int32_t> idx;
  for (int n = 0; n < N; ++n) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    for (int j = 0; j < k; ++j) {
      const size_t pick = j + mix64(key * 1000003 + static_cast<uint64_t>(n) * 131 + j) % (E - j);
      std::swap(all[j], all[pick]);
      idx.push_back(all[j]);
    }
  }
  return idx;
}

// ---- routing -------------------------------------------------------------------------------

// Random logits, plus rows of ties: all equal (the first k experts win), a tie for the largest
// (the lower index first) and a tie at the k-th place.
TEST(MoeOps, RouteIsSoftmaxThenTopKWithTiesToTheLowerExpert) {
  auto be = cpu_backend();
  const int N = 23, E = 9, k = 3;
  auto logits = random(static_cast<size_t>(N) * E, 7001, 2.f);
  for (int e = 0; e < E; ++e) logits[e] = 0.5f;         // row 0: all equal
  logits[1 * E + 6] = logits[1 * E + 2] = 9.f;          // row 1: largest tied
  for (int e = 0; e < E; ++e) logits[2 * E + e] = 0.f;  // row 2: the k-th place tied
  logits[2 * E + 0] = 9.f, logits[2 * E + 7] = 8.f, logits[2 * E + 8] = logits[2 * E + 3] = 7.f;
  for (const bool renormalize : {false, true}) {
    SCOPED_TRACE(renormalize ? "renormalized" : "not renormalized");
    const RouteRef want = route_reference(logits, N, E, k, renormalize);
    Tensor L = put(*be, {N, E}, logits), P = be->empty({N, E}, kAct);
    Tensor I = be->empty({N, k}, kAct, DType::kI32), W = be->empty({N, k}, kAct);
    be->moe_route(P, I, W, L, k, renormalize);
    EXPECT_EQ(get_i32(*be, I), want.idx);
    const std::vector<float> w = get(*be, W), p = get(*be, P);
    expect_close("probs", p, std::vector<float>(want.probs.begin(), want.probs.end()), kF32Tol,
                 "cpu", "reference");
    expect_close("topk_w", w, std::vector<float>(want.w.begin(), want.w.end()), kF32Tol, "cpu",
                 "reference");
    const std::vector<int32_t> got = get_i32(*be, I);
    EXPECT_EQ((std::vector<int32_t>{got[0], got[1], got[2]}), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(got[3], 2);  // row 1: experts 2 and 6 tie for the largest
    EXPECT_EQ(got[4], 6);
    EXPECT_EQ((std::vector<int32_t>{got[6], got[7], got[8]}), (std::vector<int32_t>{0, 7, 3}));
    if (renormalize) {
      for (int n = 0; n < N; ++n) EXPECT_NEAR(w[n * k] + w[n * k + 1] + w[n * k + 2], 1.0, 1e-6);
    }
  }
}

// L = Σ r ⊙ topk_w + Σ_n c · probs[n] (c: the balancing loss's per-expert gradient), the top-k
// set held fixed, against central differences of the double forward.
TEST(MoeOps, RouteBackwardMatchesFiniteDifferences) {
  const int N = 7, E = 6, k = 2;
  for (const bool renormalize : {false, true})
    for (const bool with_expert_grad : {false, true}) {
      SCOPED_TRACE(std::string(renormalize ? "renormalized" : "plain") +
                   (with_expert_grad ? ", dprobs_expert" : ""));
      const std::vector<double> x = widen(random(static_cast<size_t>(N) * E, 7101, 2.f));
      const std::vector<double> r = widen(random(static_cast<size_t>(N) * k, 7102));
      const std::vector<double> c = widen(random(E, 7103));
      std::vector<double> probs(x.size()), w(r.size());
      std::vector<int32_t> idx(r.size());
      cpu::moe_route<double>(probs.data(), idx.data(), w.data(), x.data(), N, E, k, renormalize);
      auto loss = [&](const std::vector<double>& logits) {
        std::vector<double> p(x.size()), ww(r.size());
        std::vector<int32_t> ii(r.size());
        cpu::moe_route<double>(p.data(), ii.data(), ww.data(), logits.data(), N, E, k, renormalize);
        EXPECT_EQ(ii, idx);  // the step never changes the selection
        double l = 0;
        for (size_t i = 0; i < ww.size(); ++i) l += r[i] * ww[i];
        if (with_expert_grad)
          for (size_t i = 0; i < p.size(); ++i) l += c[i % E] * p[i];
        return l;
      };
      std::vector<double> want(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        std::vector<double> xp = x, xm = x;
        xp[i] += kFdStep, xm[i] -= kFdStep;
        want[i] = (loss(xp) - loss(xm)) / (2 * kFdStep);
      }
      std::vector<double> got(x.size());
      cpu::moe_route_backward<double>(got.data(), r.data(), with_expert_grad ? c.data() : nullptr,
                                      probs.data(), idx.data(), N, E, k, renormalize);
      double mx = 0, err = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        mx = std::max(mx, std::fabs(want[i]));
        err = std::max(err, std::fabs(got[i] - want[i]));
      }
      EXPECT_LT(err, kFdTol * mx) << "largest |gradient| " << mx;
      // The backend's f32 op against the double kernel.
      auto be = cpu_backend();
      Tensor P = put(*be, {N, E}, std::vector<float>(probs.begin(), probs.end()));
      Tensor I = put_i32(*be, {N, k}, idx);
      Tensor dW = put(*be, {N, k}, std::vector<float>(r.begin(), r.end()));
      Tensor dE =
          with_expert_grad ? put(*be, {E}, std::vector<float>(c.begin(), c.end())) : Tensor();
      Tensor dL = put(*be, {N, E}, std::vector<float>(x.size(), NAN));  // assigned
      be->moe_route_backward(dL, dW, dE, P, I, renormalize);
      expect_close("dlogits", get(*be, dL), std::vector<float>(got.begin(), got.end()), kF32Tol,
                   "cpu", "double");
    }
}

// bf16 logits are widened: the same routing as f32 logits holding the rounded values. dlogits in
// bf16 is the f32 result rounded once.
TEST(MoeOps, RouteInBf16IsRouteOfTheRoundedLogits) {
  auto be = cpu_backend();
  const int N = 31, E = 8, k = 2;
  const auto logits = random(static_cast<size_t>(N) * E, 7201, 2.f);
  Tensor Lb = put(*be, {N, E}, logits, DType::kBF16);
  Tensor Lf = put(*be, {N, E}, get(*be, Lb));
  Tensor P[2], I[2], W[2];
  for (int t = 0; t < 2; ++t) {
    P[t] = be->empty({N, E}, kAct), I[t] = be->empty({N, k}, kAct, DType::kI32);
    W[t] = be->empty({N, k}, kAct);
    be->moe_route(P[t], I[t], W[t], t ? Lb : Lf, k, true);
  }
  EXPECT_EQ(get_i32(*be, I[0]), get_i32(*be, I[1]));
  EXPECT_EQ(get(*be, P[0]), get(*be, P[1]));
  EXPECT_EQ(get(*be, W[0]), get(*be, W[1]));
  const auto dw = random(static_cast<size_t>(N) * k, 7202);
  Tensor dW = put(*be, {N, k}, dw);
  Tensor dLf = be->empty({N, E}, kAct), dLb = be->empty({N, E}, kAct, DType::kBF16);
  be->moe_route_backward(dLf, dW, Tensor(), P[0], I[0], true);
  be->moe_route_backward(dLb, dW, Tensor(), P[0], I[0], true);
  expect_close("bf16 dlogits", get(*be, dLb), get(*be, dLf), kBf16Tol, "bf16", "f32");
}

// ---- dispatch plan -------------------------------------------------------------------------

// Dropless, a capacity that drops (weights with ties, so the token order decides), capacity 0
// and one no expert reaches.
TEST(MoeOps, DispatchPlanMatchesItsDefinition) {
  auto be = cpu_backend();
  const int N = 41, E = 5, k = 2;
  const std::vector<int32_t> idx = random_choices(N, k, E, 7301);
  std::vector<float> w = random(static_cast<size_t>(N) * k, 7302);
  for (float& v : w) v = std::round(std::fabs(v) * 4) / 4;  // a few distinct values: many ties
  for (const int64_t capacity : {int64_t{-1}, int64_t{7}, int64_t{13}, int64_t{0}, int64_t{100}}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const PlanRef want = plan_reference(idx, w, N, k, E, capacity);
    Tensor I = put_i32(*be, {N, k}, idx), W = put(*be, {N, k}, w);
    Tensor D = be->empty({N, k}, kAct, DType::kI32);
    Tensor C = be->empty({E}, kAct, DType::kI32), Rt = be->empty({E}, kAct, DType::kI32);
    be->moe_dispatch_plan(D, C, Rt, I, W, E, capacity);
    EXPECT_EQ(get_i32(*be, D), want.dest);
    EXPECT_EQ(get_i32(*be, C), want.counts);
    EXPECT_EQ(get_i32(*be, Rt), want.routed);
    if (capacity < 0 || capacity == 100) {
      EXPECT_EQ(want.counts, want.routed);
    }
  }
}

// ---- permutations --------------------------------------------------------------------------

struct Plan {
  std::vector<int32_t> idx, dest;
  std::vector<float> w;
  int64_t R = 0;
};
Plan make_plan(int N, int k, int E, int64_t capacity, uint64_t key) {
  Plan p;
  p.idx = random_choices(N, k, E, key);
  p.w = random(static_cast<size_t>(N) * k, key + 1);
  for (float& v : p.w) v = std::fabs(v);
  const PlanRef ref = plan_reference(p.idx, p.w, N, k, E, capacity);
  p.dest = ref.dest;
  for (const int32_t c : ref.counts) p.R += c;
  return p;
}

// Permute then unpermute: each token's row back, times the sum of its kept weights; the
// permuted rows are the tokens'; the backward ops against plain loops and, for the weights'
// gradient (the only non-trivial one), central differences of the double kernel.
TEST(MoeOps, PermuteAndUnpermuteRoundTrip) {
  auto be = cpu_backend();
  const int N = 29, k = 3, E = 6, C = 13;
  for (const int64_t capacity : {int64_t{-1}, int64_t{9}}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const Plan p = make_plan(N, k, E, capacity, 7401);
    const int64_t R = p.R;
    const auto x = random(static_cast<size_t>(N) * C, 7403);
    Tensor X = put(*be, {N, C}, x), D = put_i32(*be, {N, k}, p.dest), W = put(*be, {N, k}, p.w);
    Tensor XP = be->empty({R, C}, kAct), Out = be->empty({N, C}, kAct);
    be->moe_permute(XP, X, D);
    be->moe_unpermute(Out, XP, D, W);
    const auto xp = get(*be, XP), out = get(*be, Out);
    std::vector<float> want_xp(static_cast<size_t>(R) * C, NAN), want_out(x.size(), 0.f);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < k; ++j) {
        const int32_t d = p.dest[n * k + j];
        if (d < 0) continue;
        for (int c = 0; c < C; ++c) {
          want_xp[static_cast<size_t>(d) * C + c] = x[static_cast<size_t>(n) * C + c];
          want_out[static_cast<size_t>(n) * C + c] +=
              p.w[n * k + j] * x[static_cast<size_t>(n) * C + c];
        }
      }
    EXPECT_EQ(xp, want_xp);  // every row written, copied exactly
    expect_close("round trip", out, want_out, kF32Tol, "cpu", "reference");
    // Backward: dx sums the rows of dxp; dy is w · dout; dtopk_w = dout · y.
    const auto g = random(static_cast<size_t>(R) * C, 7404), gout = random(x.size(), 7405);
    Tensor G = put(*be, {R, C}, g), Gout = put(*be, {N, C}, gout);
    Tensor dX = put(*be, {N, C}, std::vector<float>(x.size(), NAN));
    Tensor dY = put(*be, {R, C}, std::vector<float>(g.size(), NAN));
    Tensor dW = put(*be, {N, k}, std::vector<float>(p.w.size(), NAN));
    be->moe_permute_backward(dX, G, D);
    be->moe_unpermute_backward(dY, dW, Gout, XP, D, W);
    std::vector<float> want_dx(x.size(), 0.f), want_dy(g.size(), NAN), want_dw(p.w.size(), 0.f);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < k; ++j) {
        const int32_t d = p.dest[n * k + j];
        if (d < 0) continue;
        double dot = 0;
        for (int c = 0; c < C; ++c) {
          const size_t t = static_cast<size_t>(n) * C + c, s = static_cast<size_t>(d) * C + c;
          want_dx[t] += g[s];
          want_dy[s] = p.w[n * k + j] * gout[t];
          dot += static_cast<double>(gout[t]) * xp[s];
        }
        want_dw[n * k + j] = static_cast<float>(dot);
      }
    expect_close("dx", get(*be, dX), want_dx, kF32Tol, "cpu", "reference");
    expect_close("dy", get(*be, dY), want_dy, kF32Tol, "cpu", "reference");
    expect_close("dtopk_w", get(*be, dW), want_dw, kF32Tol, "cpu", "reference");
    // Finite differences of L = Σ r ⊙ unpermute(y, w) in w and y, double kernels.
    const std::vector<double> yd = widen(xp), wd = widen(p.w), r = widen(gout);
    auto loss = [&](const std::vector<double>& y, const std::vector<double>& ww) {
      std::vector<double> o(r.size());
      cpu::moe_unpermute<double>(o.data(), y.data(), p.dest.data(), ww.data(), N, k, C);
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += r[i] * o[i];
      return l;
    };
    std::vector<double> dy(yd.size()), dw(wd.size());
    cpu::moe_unpermute_backward<double>(dy.data(), dw.data(), r.data(), yd.data(), p.dest.data(),
                                        wd.data(), N, k, C);
    for (size_t i = 0; i < wd.size(); ++i) {
      std::vector<double> wp = wd, wm = wd;
      wp[i] += kFdStep, wm[i] -= kFdStep;
      EXPECT_NEAR(dw[i], (loss(yd, wp) - loss(yd, wm)) / (2 * kFdStep), kFdTol) << "dtopk_w " << i;
    }
    for (size_t i = 0; i < yd.size(); i += 7) {
      std::vector<double> ypl = yd, ymi = yd;
      ypl[i] += kFdStep, ymi[i] -= kFdStep;
      EXPECT_NEAR(dy[i], (loss(ypl, wd) - loss(ymi, wd)) / (2 * kFdStep), kFdTol) << "dy " << i;
    }
  }
}

// bf16 rows: the permutation copies bits; the sums are the f32 ops' on the same values, rounded
// once.
TEST(MoeOps, PermutationsInBf16MatchF32) {
  auto be = cpu_backend();
  const int N = 19, k = 2, E = 4, C = 24;
  const Plan p = make_plan(N, k, E, -1, 7501);
  const auto x = random(static_cast<size_t>(N) * C, 7503), g = random(x.size(), 7504);
  Tensor D = put_i32(*be, {N, k}, p.dest), W = put(*be, {N, k}, p.w);
  std::vector<std::vector<float>> out[2];
  for (const DType t : {DType::kF32, DType::kBF16}) {
    Tensor Xb = put(*be, {N, C}, x, DType::kBF16), X = put(*be, {N, C}, get(*be, Xb), t);
    Tensor G = put(*be, {N, C}, get(*be, put(*be, {N, C}, g, DType::kBF16)), t);
    Tensor XP = be->empty({p.R, C}, kAct, t), Out = be->empty({N, C}, kAct, t);
    Tensor dY = be->empty({p.R, C}, kAct, t), dW = be->empty({N, k}, kAct);
    Tensor dX = be->empty({N, C}, kAct, t);
    be->moe_permute(XP, X, D);
    be->moe_unpermute(Out, XP, D, W);
    be->moe_unpermute_backward(dY, dW, G, XP, D, W);
    be->moe_permute_backward(dX, dY, D);
    out[t == DType::kBF16] = {get(*be, XP), get(*be, Out), get(*be, dY), get(*be, dW),
                              get(*be, dX)};
  }
  EXPECT_EQ(out[1][0], out[0][0]);
  const char* names[] = {"xp", "out", "dy", "dtopk_w", "dx"};
  for (int i = 1; i < 5; ++i)
    expect_close(std::string("bf16 ") + names[i], out[1][i], out[0][i], i == 3 ? 1e-5 : kBf16Tol,
                 "bf16", "f32");
}

TEST(MoeOps, ProbSumsAreColumnSums) {
  auto be = cpu_backend();
  const int N = 301, E = 70;  // two column chunks
  const auto probs = random(static_cast<size_t>(N) * E, 7601);
  Tensor P = put(*be, {N, E}, probs), S = be->empty({E}, kAct);
  be->moe_prob_sums(S, P);
  std::vector<float> want(E);
  for (int e = 0; e < E; ++e) {
    double s = 0;
    for (int n = 0; n < N; ++n) s += probs[static_cast<size_t>(n) * E + e];
    want[e] = static_cast<float>(s);
  }
  EXPECT_EQ(get(*be, S), want);  // the same double sum in the same order
}

// ---- grouped GEMM --------------------------------------------------------------------------

// Per group g: out_g = inp_g · w[g]ᵀ, dinp_g = dout_g · w[g], dw[g] += dout_gᵀ · inp_g, by plain
// loops in double; a group of no rows in the middle and at the end. In bf16 (activations and
// weights; dw f32) against the f32 ops on the rounded values.
TEST(MoeOps, GroupedMatmulIsOneMatmulPerGroup) {
  auto be = cpu_backend();
  const int I = 11, O = 7;
  const std::vector<int64_t> rows = {5, 0, 9, 3, 0};
  const int G = static_cast<int>(rows.size());
  const int64_t R = 17;
  const auto x = random(R * I, 7701), w = random(static_cast<size_t>(G) * O * I, 7702);
  const auto g = random(R * O, 7703), dw0 = random(w.size(), 7704);
  std::vector<std::vector<float>> got[2];
  for (const DType t : {DType::kF32, DType::kBF16}) {
    Tensor X = put(*be, {R, I}, x, t), Wt = put(*be, {G, O, I}, w, t), Gr = put(*be, {R, O}, g, t);
    Tensor Out = be->empty({R, O}, kAct, t), dX = be->empty({R, I}, kAct, t);
    Tensor dW = put(*be, {G, O, I}, dw0);
    be->grouped_matmul_forward(Out, X, Wt, rows);
    be->grouped_matmul_backward_input(dX, Gr, Wt, rows);
    be->grouped_matmul_backward_weight(dW, Gr, X, rows);
    got[t == DType::kBF16] = {get(*be, Out), get(*be, dX), get(*be, dW)};
    if (t == DType::kF32) {
      std::vector<float> out(R * O), dx(R * I), dw(dw0);
      int64_t r0 = 0;
      for (int gi = 0; gi < G; r0 += rows[gi], ++gi)
        for (int64_t r = r0; r < r0 + rows[gi]; ++r) {
          for (int o = 0; o < O; ++o) {
            double s = 0;
            for (int i = 0; i < I; ++i) s += double(x[r * I + i]) * w[(gi * O + o) * I + i];
            out[r * O + o] = static_cast<float>(s);
          }
          for (int i = 0; i < I; ++i) {
            double s = 0;
            for (int o = 0; o < O; ++o) s += double(g[r * O + o]) * w[(gi * O + o) * I + i];
            dx[r * I + i] = static_cast<float>(s);
          }
        }
      r0 = 0;
      for (int gi = 0; gi < G; r0 += rows[gi], ++gi)
        for (int o = 0; o < O; ++o)
          for (int i = 0; i < I; ++i) {
            double s = 0;
            for (int64_t r = r0; r < r0 + rows[gi]; ++r) s += double(g[r * O + o]) * x[r * I + i];
            dw[(gi * O + o) * I + i] += static_cast<float>(s);
          }
      expect_close("grouped out", got[0][0], out, kF32Tol, "cpu", "reference");
      expect_close("grouped dinp", got[0][1], dx, kF32Tol, "cpu", "reference");
      expect_close("grouped dweight", got[0][2], dw, kF32Tol, "cpu", "reference");
    }
  }
  const char* names[] = {"out", "dinp", "dweight"};
  for (int i = 0; i < 3; ++i)
    expect_close(std::string("bf16 grouped ") + names[i], got[1][i], got[0][i], kBf16Tol, "bf16",
                 "f32");
}

// ---- refusals ------------------------------------------------------------------------------

TEST(MoeOpsDeathTest, RefusesMisshapenOperands) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = cpu_backend();
  Tensor L = be->zeros({4, 3}, kAct), P = be->zeros({4, 3}, kAct);
  Tensor I = be->zeros({4, 2}, kAct, DType::kI32), W = be->zeros({4, 2}, kAct);
  Tensor I4 = be->zeros({4, 4}, kAct, DType::kI32), W4 = be->zeros({4, 4}, kAct);
  EXPECT_DEATH(be->moe_route(P, I4, W4, L, 4, true), "experts per token 4 outside \\[1, 3\\]");
  EXPECT_DEATH(be->moe_route(P, W, W, L, 2, true), "moe_route topk_idx is f32, expected i32");
  Tensor W3 = be->zeros({4, 3}, kAct);
  EXPECT_DEATH(be->moe_route(P, I, W3, L, 2, true), "moe_route topk_w has 12 elements, expected 8");
  EXPECT_DEATH(be->moe_route_backward(L, W, be->zeros({4}, kAct), P, I, true),
               "moe_route dprobs_expert has 4 elements, expected 3");
  Tensor C = be->zeros({3}, kAct, DType::kI32), Rt = be->zeros({3}, kAct, DType::kI32);
  Tensor bad = put_i32(*be, {4, 2}, {0, 1, 2, 3, 0, 1, 2, 0});
  EXPECT_DEATH(be->moe_dispatch_plan(I, C, Rt, bad, W, 3, -1),
               "topk_idx \\[3\\] = 3 outside \\[0, 3\\)");
  Tensor R4 = be->zeros({4}, kAct, DType::kI32);
  EXPECT_DEATH(be->moe_dispatch_plan(I, C, R4, I, W, 3, -1),
               "moe_dispatch_plan routed has 4 elements, expected 3");
  Tensor X = be->zeros({4, 5}, kAct), XP = be->zeros({8, 5}, kAct);
  Tensor XP6 = be->zeros({8, 6}, kAct);
  EXPECT_DEATH(be->moe_permute(XP6, X, I), "moe_permute xp has shape");
  Tensor far = put_i32(*be, {4, 2}, {0, 1, 2, 3, 4, 5, 6, 8});
  EXPECT_DEATH(be->moe_permute(XP, X, far), "moe dest_row \\[7\\] = 8 outside \\[-1, 8\\)");
  EXPECT_DEATH(be->moe_unpermute(X, XP, I, be->zeros({4, 3}, kAct)),
               "moe_unpermute topk_w has 12 elements, expected 8");
  Tensor Wg = be->zeros({2, 3, 5}, kAct), Out = be->zeros({8, 3}, kAct);
  EXPECT_DEATH(be->grouped_matmul_forward(Out, XP, Wg, {4, 3}),
               "the groups' rows sum to 7, grouped matmul inp has 8");
  EXPECT_DEATH(be->grouped_matmul_forward(Out, XP, Wg, {8}), "1 row counts for 2 groups");
  EXPECT_DEATH(be->grouped_matmul_forward(Out, be->zeros({8, 4}, kAct), Wg, {4, 4}),
               "grouped matmul inp has shape \\(8, 4\\), expected rows of 5");
}

}  // namespace
}  // namespace strata
