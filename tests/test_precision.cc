// bf16 mixed precision on the CPU backend (which computes in f32 and rounds where a tensor is
// bf16): the cast's rounding, the model's compute copy of the weights and its memory accounting,
// and a forward/backward close to — but not identical with — the fp32 one.
//
// Tolerances: bf16 keeps 8 significant bits (relative rounding ≤ 2^-9 ≈ 2e-3 per value). The
// loss of the tiny model averages thousands of rounded terms: 1e-2 relative bounds it with room;
// gradients go through a dozen rounded activations: 5e-2 relative in the global norm of the
// difference. Both must be non-zero, or bf16 was not in effect.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "launch/config/config_parse.h"
#include "models/gpt/gpt.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"

namespace strata {
namespace {

uint16_t bits_of_bf16(Backend& be, float x) {
  Tensor f = be.empty({1}, MemCategory::kActivations);
  Tensor h = be.empty({1}, MemCategory::kActivations, DType::kBF16);
  be.upload(f, &x);
  be.cast(h, f);
  uint16_t b = 0;
  be.download(&b, h);
  return b;
}

TEST(Precision, CastRoundsToNearestEven) {
  auto be = make_backend("cpu", 1);
  EXPECT_EQ(bits_of_bf16(*be, 1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bits_of_bf16(*be, 1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6 (even).
  EXPECT_EQ(bits_of_bf16(*be, 1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above a tie rounds up.
  EXPECT_EQ(bits_of_bf16(*be, 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(bits_of_bf16(*be, -2.0f), 0xc000);
  const uint16_t nan = bits_of_bf16(*be, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  // And back: widening is exact.
  Tensor h = be->empty({1}, MemCategory::kActivations, DType::kBF16);
  Tensor f = be->empty({1}, MemCategory::kActivations);
  const uint16_t b = 0x3f81;
  be->upload(h, &b);
  be->cast(f, h);
  EXPECT_EQ(f.f32()[0], 1.0f + std::ldexp(1.0f, -7));
}

TransformerSpec tiny_dims() {
  const Config cfg = load_config("", {"model.preset=tiny"});
  return gpt_spec(cfg.model);
}

ModelOptions precision(bool bf16) {
  ModelOptions o;
  o.bf16 = bf16;
  o.seed = 1234;
  return o;
}

struct Batch {
  Tensor tokens, targets;
};
Batch random_batch(Backend& be, const TransformerSpec& d, int B) {
  Batch b;
  b.tokens = be.empty({B, d.S}, MemCategory::kActivations, DType::kI32);
  b.targets = be.empty({B, d.S}, MemCategory::kActivations, DType::kI32);
  for (int64_t i = 0; i < B * d.S; ++i) {
    b.tokens.i32()[i] = static_cast<int32_t>(mix64(17 + static_cast<uint64_t>(i)) % d.V);
    b.targets.i32()[i] = static_cast<int32_t>(mix64(91 + static_cast<uint64_t>(i)) % d.V);
  }
  return b;
}

// The weights the model computes with are the master weights rounded, re-rounded only when
// params_changed() says the master copy moved; they count as 2-byte parameters and the fp32
// master copy as optimizer state.
TEST(Precision, ComputeCopyFollowsTheMasterWeights) {
  auto be = make_backend("cpu", 1);
  const TransformerSpec d = tiny_dims();
  const MemStats before = be->allocator().stats();
  TransformerModel model(d, precision(true), *be);
  const MemStats after = be->allocator().stats();
  const int64_t n = model.params().numel();
  // Forward only: Σ of the token losses.
  const auto loss_sum = [&](const Batch& b) {
    LossSum l;
    model.forward(ModelBatch{b.tokens, b.targets, Tensor()}, &l);
    return l.sum;
  };
  const auto grew = [&](MemCategory c) {
    return after.current[static_cast<int>(c)] - before.current[static_cast<int>(c)];
  };
  EXPECT_EQ(grew(MemCategory::kParameters), 2 * n);
  EXPECT_EQ(grew(MemCategory::kOptimizer), 4 * n);
  EXPECT_EQ(grew(MemCategory::kGradients), 4 * n);
  EXPECT_EQ(model.activation_dtype(), DType::kBF16);

  const Batch b = random_batch(*be, d, 2);
  const double l0 = loss_sum(b);
  // Writing the master weights changes nothing until params_changed() re-rounds the copy.
  float* p = model.params().params().f32();
  for (int64_t i = 0; i < n; ++i) p[i] *= 1.5f;
  EXPECT_EQ(loss_sum(b), l0);
  model.params().params_changed();
  EXPECT_NE(loss_sum(b), l0);
}

TEST(Precision, Bf16ForwardAndBackwardCloseToFp32) {
  auto be = make_backend("cpu", 1);
  TransformerModel m32(tiny_dims(), precision(false), *be);
  TransformerModel m16(tiny_dims(), precision(true), *be);
  const Batch b = random_batch(*be, tiny_dims(), 2);
  const float scale = 1.0f / static_cast<float>(2 * tiny_dims().S);
  LossSum s32, s16;
  auto a32 = m32.forward(ModelBatch{b.tokens, b.targets, Tensor()}, &s32);
  auto a16 = m16.forward(ModelBatch{b.tokens, b.targets, Tensor()}, &s16);
  const double l32 = s32.sum, l16 = s16.sum;
  const double rel = std::fabs(l16 - l32) / std::fabs(l32);
  std::printf("loss fp32 %.7f bf16 %.7f: relative difference %.2e\n", l32, l16, rel);
  EXPECT_LT(rel, 1e-2);
  EXPECT_GT(rel, 0.0);
  m32.backward(*a32, scale);
  m16.backward(*a16, scale);
  const float* g32 = m32.params().grads().f32();
  const float* g16 = m16.params().grads().f32();
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < m32.params().numel(); ++i) {
    diff += (g16[i] - g32[i]) * static_cast<double>(g16[i] - g32[i]);
    norm += g32[i] * static_cast<double>(g32[i]);
  }
  const double grel = std::sqrt(diff / norm);
  std::printf("gradients: relative difference %.2e\n", grel);
  EXPECT_LT(grel, 5e-2);
  EXPECT_GT(grel, 0.0);
}

}  // namespace
}  // namespace strata
