// Ring attention's blocks (kernels/cpu/attention_block.h) against the whole attention: a causal
// sequence cut into chunks, every (query chunk, key chunk) pair that is not wholly masked computed
// apart and merged by the log-sum-exp, equals kernels/cpu/attention.h's attention over the
// sequence (forward in double to 1e-12, float to 1e-5); the blocks' gradients, computed with the
// merged rows' lse and summed over the pairs, equal attention_backward's, and central finite
// differences of the merged output (double). Grouped-query attention (4 query heads over 2
// key/value heads) and multi-head attention.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_block.h"
#include "runtime/base/rng.h"

namespace strata::kernels::cpu {
namespace {

struct Shape {
  int B, S, NH, KVH, HS, chunks;
};

template <class T>
std::vector<T> randoms(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * normal01(seed, i));
  return v;
}

// The sequence's attention computed as ring attention computes it: per query chunk, the blocks
// of every key chunk at or before it, merged. Returns out (B, S, NH, HS) and lse (per chunk:
// [chunk][B, NH, Sc]).
template <class T>
struct Ring {
  Shape s;
  std::vector<T> qkv;
  int Sc() const { return s.S / s.chunks; }
  int W() const { return s.NH + 2 * s.KVH; }
  // Chunk c's queries (B, Sc, NH, HS) and keys/values (B, Sc, 2·KVH, HS) out of qkv.
  std::vector<T> q(int c) const { return cut(c, 0, s.NH); }
  std::vector<T> kv(int c) const { return cut(c, s.NH, 2 * s.KVH); }
  std::vector<T> cut(int c, int head0, int heads) const {
    std::vector<T> out(static_cast<size_t>(s.B) * Sc() * heads * s.HS);
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < Sc(); ++i)
        for (int h = 0; h < heads * s.HS; ++h)
          out[(static_cast<size_t>(b) * Sc() + i) * heads * s.HS + h] =
              qkv[((static_cast<size_t>(b) * s.S + c * Sc() + i) * W() + head0) * s.HS + h];
    return out;
  }
  // Rows of chunk c (B, Sc, heads·HS) into a (B, S, W, HS) buffer at head0.
  void paste(std::vector<T>& dst, int c, int head0, int heads, const std::vector<T>& src) const {
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < Sc(); ++i)
        for (int h = 0; h < heads * s.HS; ++h)
          dst[((static_cast<size_t>(b) * s.S + c * Sc() + i) * W() + head0) * s.HS + h] +=
              src[(static_cast<size_t>(b) * Sc() + i) * heads * s.HS + h];
  }

  void forward(std::vector<std::vector<T>>* outs, std::vector<std::vector<T>>* lses) const {
    const size_t rows = static_cast<size_t>(s.B) * Sc() * s.NH;
    outs->assign(s.chunks, std::vector<T>(rows * s.HS, T(0)));
    lses->assign(s.chunks, std::vector<T>(rows, -std::numeric_limits<T>::infinity()));
    std::vector<T> ob(rows * s.HS), lb(rows);
    for (int qc = 0; qc < s.chunks; ++qc) {
      const std::vector<T> qq = q(qc);
      for (int kc = 0; kc <= qc; ++kc) {
        const std::vector<T> kk = kv(kc);
        attention_block_forward(ob.data(), lb.data(), qq.data(), kk.data(), s.B, Sc(), Sc(), s.NH,
                                s.KVH, s.HS, kc == qc ? BlockMask::kCausal : BlockMask::kFull);
        attention_merge((*outs)[qc].data(), (*lses)[qc].data(), ob.data(), lb.data(), s.B, Sc(),
                        s.NH, s.HS);
      }
    }
  }
  // The whole out (B, S, NH, HS) from the chunks'.
  std::vector<T> whole(const std::vector<std::vector<T>>& outs) const {
    std::vector<T> out(static_cast<size_t>(s.B) * s.S * s.NH * s.HS);
    for (int c = 0; c < s.chunks; ++c)
      for (int b = 0; b < s.B; ++b)
        for (int i = 0; i < Sc(); ++i)
          for (int h = 0; h < s.NH * s.HS; ++h)
            out[(static_cast<size_t>(b) * s.S + c * Sc() + i) * s.NH * s.HS + h] =
                outs[c][(static_cast<size_t>(b) * Sc() + i) * s.NH * s.HS + h];
    return out;
  }
  // dqkv (the qkv layout) from the blocks' backward, given dout (B, S, NH, HS).
  std::vector<T> backward(const std::vector<T>& dout) const {
    std::vector<std::vector<T>> outs, lses;
    forward(&outs, &lses);
    std::vector<T> dqkv(qkv.size(), T(0));
    for (int qc = 0; qc < s.chunks; ++qc) {
      // This chunk's rows of dout.
      std::vector<T> d(outs[qc].size());
      for (int b = 0; b < s.B; ++b)
        for (int i = 0; i < Sc(); ++i)
          for (int h = 0; h < s.NH * s.HS; ++h)
            d[(static_cast<size_t>(b) * Sc() + i) * s.NH * s.HS + h] =
                dout[(static_cast<size_t>(b) * s.S + qc * Sc() + i) * s.NH * s.HS + h];
      std::vector<T> delta(lses[qc].size());
      attention_block_delta(delta.data(), d.data(), outs[qc].data(), s.B, Sc(), s.NH, s.HS);
      const std::vector<T> qq = q(qc);
      std::vector<T> dq(qq.size(), T(0));
      for (int kc = 0; kc <= qc; ++kc) {
        const std::vector<T> kk = kv(kc);
        std::vector<T> dkv(kk.size(), T(0));
        attention_block_backward(dq.data(), dkv.data(), d.data(), qq.data(), kk.data(),
                                 lses[qc].data(), delta.data(), s.B, Sc(), Sc(), s.NH, s.KVH, s.HS,
                                 kc == qc ? BlockMask::kCausal : BlockMask::kFull);
        paste(dqkv, kc, s.NH, 2 * s.KVH, dkv);
      }
      paste(dqkv, qc, 0, s.NH, dq);
    }
    return dqkv;
  }
};

const Shape kShapes[] = {{2, 24, 4, 2, 8, 4}, {1, 16, 2, 2, 4, 2}, {2, 12, 4, 1, 6, 3}};

template <class T>
double max_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

template <class T>
void expect_forward_equals_whole(double tol) {
  for (const Shape& s : kShapes) {
    Ring<T> r{s, randoms<T>(static_cast<size_t>(s.B) * s.S * (s.NH + 2 * s.KVH) * s.HS, 7)};
    std::vector<std::vector<T>> outs, lses;
    r.forward(&outs, &lses);
    std::vector<T> want(static_cast<size_t>(s.B) * s.S * s.NH * s.HS);
    std::vector<T> att(static_cast<size_t>(s.B) * s.NH * s.S * s.S);
    attention_forward(want.data(), att.data(), r.qkv.data(), s.B, s.S, s.NH, s.KVH, s.HS, true);
    EXPECT_LT(max_diff(r.whole(outs), want), tol) << "S " << s.S << " chunks " << s.chunks;
    // Each row's lse: log Σ_{j ≤ i} exp(q_i · k_j / √HS), summed here directly in double.
    double worst = 0;
    const int group = s.NH / s.KVH, W = s.NH + 2 * s.KVH;
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.NH; ++h)
        for (int i = 0; i < s.S; ++i) {
          double sum = 0;
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int d = 0; d < s.HS; ++d)
              dot += double(r.qkv[((size_t(b) * s.S + i) * W + h) * s.HS + d]) *
                     double(r.qkv[((size_t(b) * s.S + j) * W + s.NH + h / group) * s.HS + d]);
            sum += std::exp(dot / std::sqrt(double(s.HS)));
          }
          const int c = i / r.Sc(), row = i % r.Sc();
          const double got = double(lses[c][(size_t(b) * s.NH + h) * r.Sc() + row]);
          worst = std::max(worst, std::fabs(got - std::log(sum)));
        }
    EXPECT_LT(worst, tol) << "lse, S " << s.S;
  }
}

TEST(AttentionBlock, RingOfBlocksEqualsTheWholeAttentionDouble) {
  expect_forward_equals_whole<double>(1e-12);
}
TEST(AttentionBlock, RingOfBlocksEqualsTheWholeAttentionFloat) {
  expect_forward_equals_whole<float>(1e-5);
}

TEST(AttentionBlock, BlockGradientsSumToTheWholeAttentionsGradient) {
  for (const Shape& s : kShapes) {
    Ring<double> r{s,
                   randoms<double>(static_cast<size_t>(s.B) * s.S * (s.NH + 2 * s.KVH) * s.HS, 11)};
    const std::vector<double> dout =
        randoms<double>(static_cast<size_t>(s.B) * s.S * s.NH * s.HS, 12);
    std::vector<double> out(dout.size()), att(static_cast<size_t>(s.B) * s.NH * s.S * s.S);
    attention_forward(out.data(), att.data(), r.qkv.data(), s.B, s.S, s.NH, s.KVH, s.HS, true);
    std::vector<double> want(r.qkv.size()), scratch(attention_scratch_elems(s.S) * 64);
    attention_backward(want.data(), dout.data(), r.qkv.data(), att.data(), scratch.data(), s.B, s.S,
                       s.NH, s.KVH, s.HS, true);
    EXPECT_LT(max_diff(r.backward(dout), want), 1e-11) << "S " << s.S << " chunks " << s.chunks;
  }
}

// Central differences of Σ w ⊙ out (out merged from the blocks) against the blocks' backward,
// on every element of a small shape (the merge's rescaling and the lse it keeps are on the path).
TEST(AttentionBlock, MergedGradientsMatchFiniteDifferences) {
  const Shape s{1, 8, 2, 1, 4, 4};
  Ring<double> r{s,
                 randoms<double>(static_cast<size_t>(s.B) * s.S * (s.NH + 2 * s.KVH) * s.HS, 21)};
  const std::vector<double> w = randoms<double>(static_cast<size_t>(s.B) * s.S * s.NH * s.HS, 22);
  const auto objective = [&](const Ring<double>& x) {
    std::vector<std::vector<double>> outs, lses;
    x.forward(&outs, &lses);
    const std::vector<double> out = x.whole(outs);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += w[i] * out[i];
    return sum;
  };
  const std::vector<double> grad = r.backward(w);
  const double h = 1e-5;
  double worst = 0;
  for (size_t i = 0; i < r.qkv.size(); ++i) {
    Ring<double> up = r, down = r;
    up.qkv[i] += h;
    down.qkv[i] -= h;
    const double fd = (objective(up) - objective(down)) / (2 * h);
    worst = std::max(worst, std::fabs(fd - grad[i]) / std::max(1.0, std::fabs(fd)));
  }
  EXPECT_LT(worst, 1e-8);
}

// A row that sees no key of a block (lse −inf) leaves the running result as it was, and a block
// merged into an empty row is copied.
TEST(AttentionBlock, MergeOfAnEmptyBlockIsANoOp) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> out = {1, 2}, lse = {0.5}, ob = {9, 9}, lb = {-inf};
  attention_merge(out.data(), lse.data(), ob.data(), lb.data(), 1, 1, 1, 2);
  EXPECT_EQ(out, (std::vector<double>{1, 2}));
  EXPECT_EQ(lse[0], 0.5);
  std::vector<double> empty = {0, 0}, el = {-inf}, b = {3, 4}, bl = {0.25};
  attention_merge(empty.data(), el.data(), b.data(), bl.data(), 1, 1, 1, 2);
  EXPECT_EQ(empty, b);
  EXPECT_EQ(el[0], 0.25);
}

}  // namespace
}  // namespace strata::kernels::cpu
