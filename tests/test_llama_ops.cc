// test_llama_ops.cc — the CPU backend's Llama-family ops (RMSNorm, the per-head RMSNorm of the
// query and key heads, RoPE, SwiGLU; runtime/backend/backend.h) against the kernels of
// kernels/cpu they run, with every operand f32 and in the mixed-precision layout (bf16
// activations and compute weights, f32 statistics, parameter gradients and RoPE table), plus the
// shape checks that refuse a wrong operand.
//
// The expected values follow backend.h's contract for bf16: the inputs as the tensors hold them
// (rounded to bf16 by put()), the f32 kernel, and one round to nearest-even where a result is
// stored into a bf16 tensor, starting from the bf16 value an accumulated output held. Both sides
// run the same kernel on the same numbers with the same thread count, so they agree bit for bit:
// any difference is the backend's plumbing (a shape, a cast, a lost accumulation). The kernels'
// own correctness is test_kernels_grad's (finite differences, closed forms).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/precision.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "runtime/backend/backend.h"
#include "tests/backend_test_util.h"

namespace strata {

// The parameter's name in test listings (ctest's names included) instead of its bytes.
void PrintTo(DType t, std::ostream* os) {
  *os << to_string(t);
}

namespace {

namespace cpu = kernels::cpu;
using backend_test::get;
using backend_test::put;
using backend_test::random;

// What a tensor of type t holds after storing v: v itself in f32, v rounded to bf16 in bf16.
std::vector<float> stored(const std::vector<float>& v, DType t) {
  if (t == DType::kF32) return v;
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = cpu::bf16_to_f32(cpu::f32_to_bf16(v[i]));
  return r;
}

// Bitwise agreement, reporting the first few elements that differ.
void expect_same(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: backend " << got[i] << ", kernel " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " differ";
}

// The parameter: the type of activations, their gradients and the compute weights (statistics,
// parameter gradients and the RoPE table stay f32, as in training).
class CpuLlamaOps : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Backend> be_ = make_backend("cpu", 2);
  DType act_ = GetParam();
};

TEST_P(CpuLlamaOps, RmsNormMatchesKernels) {
  const int64_t B = 2, S = 5, C = 48, N = B * S;
  const float eps = 1e-5f;
  const auto x = stored(random(N * C, 1), act_);    // (N, C)
  const auto w = stored(random(C, 2, 0.5f), act_);  // (C)
  const auto dy = stored(random(N * C, 3), act_);   // (N, C)
  const auto dx0 = stored(random(N * C, 4), act_);  // (N, C): accumulated into
  const auto dw0 = random(C, 5);                    // (C) f32: accumulated into
  Tensor inp = put(*be_, {B, S, C}, x, act_), weight = put(*be_, {C}, w, act_);
  Tensor out = be_->empty({B, S, C}, MemCategory::kActivations, act_);
  Tensor rstd = be_->empty({N}, MemCategory::kActivations);
  be_->rmsnorm_forward(out, rstd, inp, weight, eps);

  std::vector<float> want_out(N * C), want_rstd(N);
  cpu::rmsnorm_forward<float>(want_out.data(), want_rstd.data(), x.data(), w.data(), N, C, eps);
  expect_same(get(*be_, out), stored(want_out, act_), "rmsnorm out");
  expect_same(get(*be_, rstd), want_rstd, "rmsnorm rstd");

  Tensor dout = put(*be_, {B, S, C}, dy, act_), dinp = put(*be_, {B, S, C}, dx0, act_);
  Tensor dw = put(*be_, {C}, dw0);
  be_->rmsnorm_backward(dinp, dw, dout, inp, weight, rstd);
  std::vector<float> want_dx = dx0, want_dw = dw0;
  cpu::rmsnorm_backward<float>(want_dx.data(), want_dw.data(), dy.data(), x.data(), w.data(),
                               want_rstd.data(), N, C);
  expect_same(get(*be_, dinp), stored(want_dx, act_), "rmsnorm dinp");
  expect_same(get(*be_, dw), want_dw, "rmsnorm dweight");
}

TEST_P(CpuLlamaOps, RopeMatchesKernels) {
  const int64_t B = 2, S = 7, S_max = 9, NH = 4, KVH = 2, HS = 16, W = (NH + 2 * KVH) * HS;
  std::vector<float> table(S_max * HS);  // (S_max, HS): [cos | sin] of s·10000^(−2i/HS)
  for (int64_t s = 0; s < S_max; ++s) {
    for (int64_t i = 0; i < HS / 2; ++i) {
      const double theta = s * std::pow(10000.0, -2.0 * i / HS);
      table[s * HS + i] = static_cast<float>(std::cos(theta));
      table[s * HS + HS / 2 + i] = static_cast<float>(std::sin(theta));
    }
  }
  const Tensor cos_sin = put(*be_, {S_max, HS}, table);  // f32 in every precision
  const auto x = stored(random(B * S * W, 10), act_);    // (B, S, NH + 2·KVH, HS)
  const auto dy = stored(random(B * S * W, 11), act_);   // (B, S, NH + 2·KVH, HS)

  Tensor qkv = put(*be_, {B, S, W}, x, act_);
  be_->rope_forward(qkv, cos_sin, NH, KVH);
  std::vector<float> want = x;
  cpu::rope_forward<float>(want.data(), table.data(), B, S, NH, KVH, HS);
  expect_same(get(*be_, qkv), stored(want, act_), "rope qkv");

  Tensor dqkv = put(*be_, {B, S, W}, dy, act_);
  be_->rope_backward(dqkv, cos_sin, NH, KVH);
  std::vector<float> want_d = dy;
  cpu::rope_backward<float>(want_d.data(), table.data(), B, S, NH, KVH, HS);
  expect_same(get(*be_, dqkv), stored(want_d, act_), "rope dqkv");
}

TEST_P(CpuLlamaOps, QkRmsNormMatchesKernels) {
  const int64_t B = 2, S = 5, NH = 4, KVH = 2, HS = 16, W = (NH + 2 * KVH) * HS, N = B * S;
  const float eps = 1e-6f;
  const auto x = stored(random(N * W, 30, 2.f), act_);    // (B, S, NH + 2·KVH, HS)
  const auto qw = stored(random(HS, 31, 0.5f), act_);     // (HS)
  const auto kw = stored(random(HS, 32, 0.5f), act_);     // (HS)
  const auto dy = stored(random(N * W, 33), act_);        // (B, S, NH + 2·KVH, HS)
  const auto dq0 = random(HS, 34), dk0 = random(HS, 35);  // (HS) f32: accumulated into
  const Tensor q_weight = put(*be_, {HS}, qw, act_), k_weight = put(*be_, {HS}, kw, act_);
  Tensor qkv = put(*be_, {B, S, W}, x, act_);
  Tensor rstd = be_->empty({N * (NH + KVH)}, MemCategory::kActivations);
  be_->qk_rmsnorm_forward(qkv, rstd, q_weight, k_weight, NH, KVH, eps);
  std::vector<float> want = x, want_rstd(N * (NH + KVH));
  cpu::qk_rmsnorm_forward<float>(want.data(), want_rstd.data(), qw.data(), kw.data(), N, NH, KVH,
                                 HS, eps);
  expect_same(get(*be_, qkv), stored(want, act_), "qk_rmsnorm qkv");  // value heads included
  expect_same(get(*be_, rstd), want_rstd, "qk_rmsnorm rstd");

  // The backward of the pre-norm x, in place on dqkv.
  const Tensor pre = put(*be_, {B, S, W}, x, act_);
  Tensor dqkv = put(*be_, {B, S, W}, dy, act_);
  Tensor dq = put(*be_, {HS}, dq0), dk = put(*be_, {HS}, dk0);
  be_->qk_rmsnorm_backward(dqkv, dq, dk, pre, q_weight, k_weight, rstd, NH, KVH);
  std::vector<float> want_d = dy, want_dq = dq0, want_dk = dk0;
  cpu::qk_rmsnorm_backward<float>(want_d.data(), want_dq.data(), want_dk.data(), x.data(),
                                  qw.data(), kw.data(), want_rstd.data(), N, NH, KVH, HS);
  expect_same(get(*be_, dqkv), stored(want_d, act_), "qk_rmsnorm dqkv");
  expect_same(get(*be_, dq), want_dq, "qk_rmsnorm dq_weight");
  expect_same(get(*be_, dk), want_dk, "qk_rmsnorm dk_weight");
}

TEST_P(CpuLlamaOps, SwiGluMatchesKernels) {
  const int64_t B = 2, S = 5, F = 24, N = B * S;
  const auto gu = stored(random(N * 2 * F, 20, 3.f), act_);  // (N, 2F): [gate | up]
  const auto dy = stored(random(N * F, 21), act_);           // (N, F)
  const Tensor gate_up = put(*be_, {B, S, 2 * F}, gu, act_);
  Tensor out = be_->empty({B, S, F}, MemCategory::kActivations, act_);
  be_->swiglu_forward(out, gate_up);
  std::vector<float> want(N * F);
  cpu::swiglu_forward<float>(want.data(), gu.data(), N, F);
  expect_same(get(*be_, out), stored(want, act_), "swiglu out");

  // dgate_up is assigned: NaN to start with shows any element read or left unwritten.
  const std::vector<float> nans(N * 2 * F, std::numeric_limits<float>::quiet_NaN());
  Tensor dgate_up = put(*be_, {B, S, 2 * F}, nans, act_);
  const Tensor dout = put(*be_, {B, S, F}, dy, act_);
  be_->swiglu_backward(dgate_up, dout, gate_up);
  std::vector<float> want_d(N * 2 * F);
  cpu::swiglu_backward<float>(want_d.data(), dy.data(), gu.data(), N, F);
  expect_same(get(*be_, dgate_up), stored(want_d, act_), "swiglu dgate_up");
}

INSTANTIATE_TEST_SUITE_P(Types, CpuLlamaOps, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return std::string(to_string(p.param));
                         });

// Operands the ops must refuse, each with a message naming the sizes. STRATA_CHECK aborts the
// process, hence death tests ("threadsafe": the backend has started OpenMP threads).
TEST(CpuLlamaOpsDeathTest, RefusesMisshapenOperands) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  const MemCategory a = MemCategory::kActivations;
  Tensor qkv = be->zeros({1, 2, 3 * 4}, a);  // NH = KVH = 1, HS = 4
  const Tensor table = be->zeros({2, 4}, a);
  EXPECT_DEATH(be->rope_forward(qkv, be->zeros({2, 4}, a, DType::kBF16), 1, 1),
               "rope cos_sin is bf16, expected f32");
  EXPECT_DEATH(be->rope_forward(qkv, be->zeros({1, 4}, a), 1, 1),
               "rope cos_sin has 1 positions, fewer than the sequence 2");
  EXPECT_DEATH(be->rope_backward(qkv, be->zeros({2, 6}, a), 1, 1), "expected .S_max, 4.");
  Tensor odd = be->zeros({1, 2, 3 * 3}, a);  // HS = 3
  EXPECT_DEATH(be->rope_forward(odd, be->zeros({2, 3}, a), 1, 1), "head size 3 is odd");
  EXPECT_DEATH(be->rope_forward(qkv, table, 3, 2), "not a multiple of key/value heads 2");

  Tensor out = be->zeros({2, 3}, a);
  EXPECT_DEATH(be->swiglu_forward(out, be->zeros({2, 7}, a)),
               "swiglu gate_up last dimension 7 is odd");
  EXPECT_DEATH(be->swiglu_forward(out, be->zeros({2, 8}, a)), "swiglu out has 6 elements");

  Tensor x = be->zeros({2, 6}, a), rstd = be->zeros({2}, a);
  EXPECT_DEATH(be->rmsnorm_forward(x, rstd, x, be->zeros({5}, a), 1e-5f),
               "rmsnorm weight has 5 elements, expected 6");
  Tensor dw = be->zeros({6}, a);
  EXPECT_DEATH(be->rmsnorm_backward(x, dw, x, x, be->zeros({6}, a), be->zeros({3}, a)),
               "rmsnorm rstd has 3 elements, expected 2");

  // qk_rmsnorm on qkv (1, 2, (1 + 2·1)·4): 2 positions of a query and a key head, rstd (4).
  Tensor qk_rstd = be->zeros({4}, a), dq = be->zeros({4}, a), dk = be->zeros({4}, a);
  const Tensor w4 = be->zeros({4}, a);
  EXPECT_DEATH(be->qk_rmsnorm_forward(qkv, qk_rstd, be->zeros({3}, a), w4, 1, 1, 1e-6f),
               "qk_rmsnorm q_weight has 3 elements, expected 4");
  EXPECT_DEATH(be->qk_rmsnorm_forward(qkv, qk_rstd, w4, be->zeros({5}, a), 1, 1, 1e-6f),
               "qk_rmsnorm k_weight has 5 elements, expected 4");
  Tensor rstd6 = be->zeros({6}, a);  // the value heads' too: one per head
  EXPECT_DEATH(be->qk_rmsnorm_forward(qkv, rstd6, w4, w4, 1, 1, 1e-6f),
               "qk_rmsnorm rstd has 6 elements, expected 4");
  Tensor rstd_i32 = be->zeros({4}, a, DType::kI32);
  EXPECT_DEATH(be->qk_rmsnorm_forward(qkv, rstd_i32, w4, w4, 1, 1, 1e-6f),
               "qk_rmsnorm rstd is i32, expected f32 or bf16");
  EXPECT_DEATH(be->qk_rmsnorm_forward(qkv, qk_rstd, w4, w4, 3, 1, 1e-6f),
               "attention qkv width 12 is not");
  EXPECT_DEATH(
      be->qk_rmsnorm_backward(qkv, dq, dk, be->zeros({1, 1, 12}, a), w4, w4, qk_rstd, 1, 1),
      "qk_rmsnorm x has 12 elements, expected 24");
  EXPECT_DEATH(be->qk_rmsnorm_backward(qkv, dq, rstd6, qkv, w4, w4, qk_rstd, 1, 1),
               "qk_rmsnorm dk_weight has 6 elements, expected 4");
}

}  // namespace
}  // namespace strata
