// QK-norm (AttentionSpec::qk_norm, Qwen3's q_norm / k_norm) in the attention layer and in a whole
// model, against references that do not share its code path:
//   * the layer's normalised q/k/v against the definition computed here, in double, from the
//     pre-norm q/k/v the layer keeps: each query head x · rstd · q_weight, each key head with
//     k_weight, rstd = 1/√(mean(x²) + eps), the value heads untouched;
//   * a Llama-shaped model with QK-norm: the gradients of its norm weights and of a q/k/v weight
//     against central finite differences of the loss sum, and the parameters it adds (two of HS
//     per layer) in its layout and self-description;
//   * decoding over the key/value cache against the training forward's argmax (the norm is
//     applied to every new position before the rotation, as in training).
// The kernels themselves are test_kernels_grad's (finite differences in double) and the tensor
// layouts mpi_test_parallel's (QkNorm.*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "launch/config/config_parse.h"
#include "models/layers/attention.h"
#include "models/llama/llama.h"
#include "models/transformer/transformer.h"
#include "runtime/backend/backend.h"
#include "tests/decode_check.h"

namespace strata {
namespace {

// The tiny Llama with QK-norm (the norm weights named as Qwen3's).
TransformerSpec qk_norm_spec(std::vector<std::string> sets = {}) {
  sets.insert(sets.begin(), {"model.preset=llama-tiny", "model.init_std=0.3", "model.seq_len=16"});
  TransformerSpec s = llama_spec(load_config("", sets).model);
  s.block.attention.qk_norm = true;
  s.block.names.q_norm = "self_attn.q_norm";
  s.block.names.k_norm = "self_attn.k_norm";
  return s;
}

// Sets every QK-norm weight away from its initial ones (0.6 … 1.4), so that a weight applied to
// the wrong heads, or not at all, shows.
void spread_norm_weights(ParamStore& store) {
  float* p = store.params().f32();
  for (const ParamInfo& info : store.infos()) {
    if (info.name.find("_norm.weight") == std::string::npos ||
        info.name.find("self_attn") == std::string::npos)
      continue;
    const double k = info.name.find("k_norm") != std::string::npos ? 0.37 : 0.0;
    for (int64_t i = 0; i < info.numel; ++i)
      p[info.offset + i] = static_cast<float>(1.0 + 0.4 * std::sin(1.3 * i + k));
  }
  store.params_changed();
}

TEST(QkNorm, NormalisesEachQueryAndKeyHeadWithItsWeight) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  AttentionSpec a;
  a.heads = 4;
  a.kv_heads = 2;
  a.head_size = 6;
  a.qk_norm = true;
  a.qk_norm_eps = 1e-6;
  const int64_t C = 24, B = 2, S = 5, HS = a.head_size;
  ParamLayout layout(1, 0);
  const SelfAttention attn(layout, {"qkv", "proj", "q_norm", "k_norm"}, C, a, LinearInit{0.3},
                           LinearInit{0.3}, nullptr);
  EXPECT_EQ(layout.info(attn.q_norm).numel, HS);
  EXPECT_EQ(layout.info(attn.k_norm).numel, HS);
  ParamStore store(std::move(layout), *be, false, 7);
  spread_norm_weights(store);
  TensorParallel tp(*be, nullptr, 1, 0, false, DType::kF32);
  const LayerEnv env{*be, store, tp, DType::kF32};
  Tensor x = be->empty({B, S, C}, MemCategory::kActivations);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = static_cast<float>(std::sin(0.7 * i) * 2);
  SelfAttention::Saved s;
  attn.forward(env, x, x, s);
  ASSERT_TRUE(s.qkv_raw.defined());
  const float* raw = s.qkv_raw.f32();
  const float* got = s.qkv.f32();
  const float* wq = store.params().f32() + store.info(attn.q_norm).offset;
  const float* wk = store.params().f32() + store.info(attn.k_norm).offset;
  const int64_t heads = a.heads + 2 * a.kv_heads, W = heads * HS;
  int bad = 0;
  for (int64_t n = 0; n < B * S; ++n)
    for (int64_t j = 0; j < heads; ++j) {
      const float* xr = raw + n * W + j * HS;
      const float* yr = got + n * W + j * HS;
      if (j >= a.heads + a.kv_heads) {  // a value head: as the projection made it
        for (int64_t i = 0; i < HS; ++i) bad += yr[i] != xr[i];
        continue;
      }
      double ms = 0;
      for (int64_t i = 0; i < HS; ++i) ms += double{xr[i]} * xr[i];
      const double rstd = 1 / std::sqrt(ms / HS + a.qk_norm_eps);
      const float* w = j < a.heads ? wq : wk;
      for (int64_t i = 0; i < HS; ++i) {
        const double want = xr[i] * rstd * w[i];
        if (std::fabs(yr[i] - want) > 1e-5 * (1 + std::fabs(want))) ++bad;
      }
    }
  EXPECT_EQ(bad, 0);
}

struct QkModel {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  TransformerSpec spec = qk_norm_spec();
  std::unique_ptr<TransformerModel> model;
  Tensor tokens, targets;
  QkModel() {
    ModelOptions o;
    o.seed = 11;
    model = std::make_unique<TransformerModel>(spec, o, *be);
    spread_norm_weights(model->params());
    const int B = 2, S = 12;
    tokens = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
    targets = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
    for (int i = 0; i < B * S; ++i) {
      tokens.i32()[i] = (7 * i + 3) % spec.V;
      targets.i32()[i] = (5 * i + 1) % spec.V;
    }
  }
  double loss() {
    LossSum l;
    model->forward(ModelBatch{tokens, targets}, &l);
    return l.sum;
  }
};

// d(loss sum)/d(w) by the backward against finite differences, for every element of layer 0's
// and layer 1's q_norm and k_norm weights and a few of a q/k/v weight. The model is strongly
// curved (init_std 0.3: central differences at h = 1e-2 are off by up to 4e-3 on gradients near 3)
// and its f32 loss sum carries ~2e-5 of rounding noise, which differs between builds (the
// sanitizer build's code rounds differently). The fourth-order stencil at h = 2e-2 removes the
// curvature; what remains is the noise, measured at up to 1.0e-3 absolute in the Release and the
// sanitizer builds. 2e-2 relative plus 2e-3 absolute is twice that and still far below what a
// wrong gradient moves (gradients from 0.03 to 3).
TEST(QkNorm, GradientsMatchFiniteDifferences) {
  QkModel m;
  ParamStore& store = m.model->params();
  store.zero_grads();
  {
    LossSum l;
    PieceActsPtr acts = m.model->forward(ModelBatch{m.tokens, m.targets}, &l);
    m.model->backward(*acts, 1.0f);
  }
  const std::vector<float> grads(store.grads().f32(), store.grads().f32() + store.numel());
  int checked = 0, bad = 0;
  for (const ParamInfo& info : store.infos()) {
    const bool norm = info.name.find("_norm.weight") != std::string::npos &&
                      info.name.find("self_attn") != std::string::npos;
    const bool qkv = info.name == "layers.0.self_attn.qkv_proj.weight";
    if (!norm && !qkv) continue;
    const int64_t step = qkv ? info.numel / 7 : 1;
    for (int64_t i = 0; i < info.numel; i += step) {
      float& w = store.params().f32()[info.offset + i];
      const float w0 = w;
      const double h = 2e-2;
      auto loss_at = [&](double d) {
        w = static_cast<float>(w0 + d);
        store.params_changed();
        return m.loss();
      };
      const double fd =
          (8 * (loss_at(h) - loss_at(-h)) - (loss_at(2 * h) - loss_at(-2 * h))) / (12 * h);
      w = w0;
      store.params_changed();
      const double g = grads[static_cast<size_t>(info.offset + i)];
      ++checked;
      if (std::fabs(g - fd) > 2e-2 * std::fabs(fd) + 2e-3) {
        ++bad;
        ADD_FAILURE() << info.name << "[" << i << "]: backward " << g << ", differences " << fd;
      }
    }
  }
  // Two layers' q_norm and k_norm, and 7 or 8 elements of q/k/v.
  EXPECT_GE(checked, 2 * 2 * m.spec.block.attention.head_size + 7);
  EXPECT_EQ(bad, 0);
}

// The layout and the self-description count the norm weights: 2·HS more per layer than the
// same model without QK-norm, on every tensor rank (they are replicated).
TEST(QkNorm, ParametersAreCountedInTheLayoutAndTheDescription) {
  TransformerSpec with = qk_norm_spec(), without = qk_norm_spec();
  without.block.attention.qk_norm = false;
  const int64_t HS = with.block.attention.head_size;
  for (int t : {1, 2}) {
    const int64_t a = TransformerModel::layout(with, t, 0, false, {{0, 1, false, false}}).numel();
    const int64_t b =
        TransformerModel::layout(without, t, 0, false, {{0, 1, false, false}}).numel();
    EXPECT_EQ(a - b, 2 * HS) << "t " << t;
    EXPECT_EQ(describe_transformer(with)->layer_parameters(t, 0) -
                  describe_transformer(without)->layer_parameters(t, 0),
              2 * HS);
  }
  // Its activations: q/k/v once more before the norm and a statistic per head.
  const RankShape r{1, false};
  const double more =
      describe_transformer(with)->layer_activations(2, r, Recompute::kNone, false, 0).saved -
      describe_transformer(without)->layer_activations(2, r, Recompute::kNone, false, 0).saved;
  const AttentionSpec& att = with.block.attention;
  EXPECT_DOUBLE_EQ(more, 2.0 * with.S * (att.qkv_width() + att.heads + att.kv_heads));
}

// Greedy decoding over the cache picks the training forward's argmax at every position.
TEST(QkNorm, DecodingOverTheCacheFollowsTheTrainingForward) {
  QkModel m;
  expect_decoding_follows_forward(*m.model, *m.be, m.spec.V, {5, 9, 2}, 8);
}

}  // namespace
}  // namespace strata
