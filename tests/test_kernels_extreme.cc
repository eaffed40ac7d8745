// test_kernels_extreme.cc — exp_fast (kernels/cpu/util.h) and the kernels built on it (GELU,
// attention's softmax, cross-entropy) on extreme inputs: NaN of every sign and payload, ±inf,
// the largest floats, the edges of exp_fast's ±87 band.
//
// Issue 28: UBSan found a signed integer overflow in exp_fast (the exponent bits of 2^n,
// (tbits - kRoundBits + 127) * (1 << 23), for a NaN input), reached from GELU, attention and
// cross-entropy. exp_fast is inline, so the calls below compile it into this executable, which
// tests/CMakeLists.txt builds with -fsanitize=undefined -fno-sanitize-recover: undefined
// behaviour in it aborts this test. The fix keeps every result bit-identical (checked over all
// 2^32 floats against the signed formula evaluated with wrapping when it was made).
//
// Expected values: the saturations exp_fast documents (0 below −87, inf above 87, NaN kept),
// std::exp within exp_fast's documented 1.4 ulp inside the band, and properties of the kernels
// that hold for any input (probabilities in [0, 1] summing to 1, finite losses of finite
// logits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/util.h"

namespace cpu = strata::kernels::cpu;

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMax = std::numeric_limits<float>::max();

// Every NaN class: quiet and signalling, both signs, smallest and largest payloads.
std::vector<float> nans() {
  std::vector<float> v;
  for (uint32_t b : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu,
                     0x7FA5A5A5u, 0xFFA5A5A5u})
    v.push_back(from_bits(b));
  return v;
}

TEST(ExpFast, NanStaysNan) {
  for (float x : nans()) EXPECT_TRUE(std::isnan(cpu::exp_fast(x))) << x;
}

TEST(ExpFast, SaturatesOutsideItsBand) {
  const std::vector<float> above = {kInf, kMax, 1e30f, 1e10f, 88.0f, std::nextafter(87.0f, 88.0f)};
  for (float x : above) {
    EXPECT_EQ(cpu::exp_fast(x), kInf) << x;
    EXPECT_EQ(cpu::exp_fast(-x), 0.0f) << -x;
  }
}

TEST(ExpFast, WithinTwoUlpOfExpInsideItsBand) {
  // Both edges of the band, zero and the smallest magnitudes, and a sweep between.
  std::vector<float> xs = {87.0f,
                           -87.0f,
                           0.0f,
                           -0.0f,
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           -1e-30f};
  for (int i = -869; i <= 869; ++i) xs.push_back(static_cast<float>(i) * 0.1f + 0.0123f);
  for (float x : xs) {
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(want), kInf) - static_cast<float>(want);
    EXPECT_LE(std::abs(cpu::exp_fast(x) - want), 2 * ulp) << x;
  }
}

TEST(GeluExtreme, FiniteInFiniteOutNanKept) {
  std::vector<float> in = {kMax, -kMax, 1e30f, -1e30f, 100.0f, -100.0f, 0.0f};
  const size_t finite = in.size();
  for (float x : nans()) in.push_back(x);
  std::vector<float> out(in.size());
  cpu::gelu_forward(out.data(), in.data(), in.size());
  for (size_t i = 0; i < finite; ++i)
    EXPECT_TRUE(std::isfinite(out[i])) << in[i] << " -> " << out[i];
  EXPECT_EQ(out[4], 100.0f);
  EXPECT_EQ(out[5], 0.0f);
  for (size_t i = finite; i < in.size(); ++i) EXPECT_TRUE(std::isnan(out[i]));
  std::vector<float> dout(in.size(), 1.0f), dinp(in.size());
  cpu::gelu_backward(dinp.data(), in.data(), dout.data(), in.size());
  for (size_t i = finite; i < in.size(); ++i) EXPECT_TRUE(std::isnan(dinp[i]));
}

TEST(CrossEntropyExtreme, HugeLogitsGiveFiniteLossesNanGivesNan) {
  // Row 0: logits ±1e30 (differences beyond exp's range); row 1: a NaN logit.
  const int N = 2, V = 4;
  std::vector<float> logits = {1e30f, -1e30f, 0.0f, kMax, 1.0f, nans()[0], 2.0f, 3.0f};
  const std::vector<int32_t> targets = {1, 2};
  std::vector<float> mx(N), sum(N), tl(N), loss(N), dlogits(logits.size());
  cpu::ce_row_max(mx.data(), logits.data(), N, V, V);
  cpu::ce_row_sumexp(sum.data(), logits.data(), mx.data(), N, V, V);
  cpu::ce_target_logit(tl.data(), logits.data(), targets.data(), N, V, 0, V);
  cpu::ce_losses(loss.data(), mx.data(), sum.data(), tl.data(), static_cast<const float*>(nullptr),
                 N);
  cpu::ce_backward(dlogits.data(), logits.data(), mx.data(), sum.data(), targets.data(),
                   static_cast<const float*>(nullptr), 1.0f, N, V, 0, V);
  EXPECT_TRUE(std::isfinite(loss[0])) << loss[0];
  EXPECT_GE(loss[0], 0.0f);
  for (int j = 0; j < V; ++j) EXPECT_TRUE(std::isfinite(dlogits[static_cast<size_t>(j)]));
  EXPECT_TRUE(std::isnan(loss[1]));
}

TEST(AttentionExtreme, LargeScoresStillGiveProbabilities) {
  // One head, head size 4, three positions; queries and keys of 1e4 make scores of ±1e8, far
  // outside exp's range once the row maximum is subtracted.
  const int B = 1, S = 3, NH = 1, KVH = 1, HS = 4;
  std::vector<float> qkv(static_cast<size_t>(B * S * (NH + 2 * KVH) * HS));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = (i % 3 == 0 ? -1e4f : 1e4f);
  std::vector<float> out(static_cast<size_t>(B * S * NH * HS)), att(static_cast<size_t>(S * S));
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, S, NH, KVH, HS);
  for (int t = 0; t < S; ++t) {
    double row = 0;
    for (int s = 0; s <= t; ++s) {
      const float p = att[static_cast<size_t>(t * S + s)];
      EXPECT_TRUE(p >= 0.0f && p <= 1.0f) << p;
      row += p;
    }
    EXPECT_NEAR(row, 1.0, 1e-6) << "row " << t;
  }
  for (float o : out) EXPECT_TRUE(std::isfinite(o));
  // A NaN query: its row is NaN, the kernel still returns.
  qkv[0] = nans()[0];
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, S, NH, KVH, HS);
  EXPECT_TRUE(std::isnan(att[0]));
}

}  // namespace
