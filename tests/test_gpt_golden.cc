// GPT forward, backward and 10 AdamW steps against PyTorch (tests/golden/gpt_tiny.safetensors,
// written by tests/golden/make_gpt_fixture.py, which computes every reference in float64).
//
// Tolerances, and why:
//  * logits, loss, gradients: 1e-4 × the largest magnitude in the tensor. Strata computes in
//    float32; the fixture's own float32 replay of the same recipe stays within ~5e-7 of the
//    float64 reference, so 1e-4 leaves room for different summation orders (OpenBLAS blocking,
//    OpenMP reductions) while still catching any wrong term, which shows up at 1e-2 or more.
//  * step losses and gradient norms: 1e-5 relative (scalars averaged over many terms).
//  * final weights after 10 steps: 1e-4 absolute. AdamW divides by √v̂, which amplifies tiny
//    gradient differences; the fixture's float32 replay moves weights by ≤ 1.8e-6 except on the
//    key rows of c_attn.bias, whose true gradient is exactly 0 (a constant added to all scores of
//    a softmax row changes nothing), so float32 rounding noise there is normalised by Adam into
//    steps of up to 1.7e-5. Those 2×32 entries get 1e-3 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/gpt/gpt.h"
#include "models/transformer/lm_head.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/optimizer.h"
#include "runtime/io/safetensors.h"

namespace strata {
namespace {

const std::string kFixture = std::string(STRATA_TEST_DIR) + "/golden/gpt_tiny.safetensors";

struct Golden {
  StFile f;
  nlohmann::json cfg;
  TransformerSpec dims;
  int Vp = 0;  // the vocabulary as stored (padded to a multiple of 128)
  int B = 0;
};

// The golden model on one rank (tensor 1), initialised from seed 1 before the fixture's weights
// are copied in.
ModelOptions options(Recompute recompute = Recompute::kNone) {
  ModelOptions o;
  o.recompute = recompute;
  o.seed = 1;
  return o;
}

// Forward of one batch through the whole model; *loss_sum receives Σ of the token losses.
PieceActsPtr forward(Model& model, const Tensor& in, const Tensor& tg, double* loss_sum) {
  LossSum l;
  PieceActsPtr acts = model.forward(ModelBatch{in, tg, Tensor()}, &l);
  *loss_sum = l.sum;
  return acts;
}

Golden load() {
  Golden g;
  g.f = read_safetensors(kFixture);
  g.cfg = nlohmann::json::parse(g.f.metadata.at("config"));
  ModelConfig m;
  m.num_layers = g.cfg["num_layers"];
  m.hidden_size = g.cfg["hidden_size"];
  m.num_heads = g.cfg["num_heads"];
  m.ffn_hidden_size = g.cfg["ffn_hidden_size"];
  m.seq_len = g.cfg["seq_len"];
  m.vocab_size = g.cfg["vocab_size"];
  m.tie_embeddings = true;
  g.dims = gpt_spec(m);
  g.Vp = pad_vocab(m.vocab_size, 128);
  g.B = g.cfg["batch_size"];
  return g;
}

// Copies the fixture's weights into the model; padded vocabulary rows stay 0.
void load_weights(TransformerModel& model, const Golden& g, const std::string& prefix = "") {
  ParamStore& ps = model.params();
  std::fill(ps.params().f32(), ps.params().f32() + ps.numel(), 0.0f);
  for (const ParamInfo& p : ps.infos()) {
    const std::vector<float> v = g.f.at(prefix + p.name, kFixture).as_f32();
    ASSERT_LE(static_cast<int64_t>(v.size()), p.numel) << p.name;
    std::copy(v.begin(), v.end(), ps.params().f32() + p.offset);
  }
}

// Splits (B, S+1) tokens into inputs and targets (B, S).
void split_tokens(const std::vector<int32_t>& tok, int B, int S, Tensor& in, Tensor& tg) {
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s) {
      in.i32()[b * S + s] = tok[static_cast<size_t>(b * (S + 1) + s)];
      tg.i32()[b * S + s] = tok[static_cast<size_t>(b * (S + 1) + s + 1)];
    }
}

// The fixture's first batch as inputs and targets (B, S) on the backend.
struct FixtureBatch {
  Tensor in, tg;
};
FixtureBatch fixture_batch(Backend& be, const Golden& g) {
  const int B = g.B, S = g.dims.S;
  FixtureBatch b{be.empty({B, S}, MemCategory::kActivations, DType::kI32),
                 be.empty({B, S}, MemCategory::kActivations, DType::kI32)};
  split_tokens(g.f.at("tokens", kFixture).as_i32(), B, S, b.in, b.tg);
  return b;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// Compares got (numel elements) with the reference; returns the number of mismatches.
int compare(const std::string& what, const float* got, const std::vector<float>& want,
            double tol_rel_to_max) {
  const double tol = tol_rel_to_max * std::max(max_abs(want), 1e-30);
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > tol) {
      if (bad < 3)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                      << " (tolerance " << tol << ")";
      ++bad;
    }
  }
  return bad;
}

TEST(GptGolden, ForwardLogitsAndLoss) {
  Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(g.dims, options(), *be);
  load_weights(model, g);
  const int B = g.B, S = g.dims.S, V = g.dims.V, Vp = g.Vp;
  Tensor in = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  Tensor tg = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  split_tokens(g.f.at("tokens", kFixture).as_i32(), B, S, in, tg);
  double loss_sum = 0;
  auto acts = forward(model, in, tg, &loss_sum);
  const std::vector<float> want_logits = g.f.at("logits", kFixture).as_f32();
  std::vector<float> got(want_logits.size());
  const float* logits = lm_logits(*acts).f32();
  for (int n = 0; n < B * S; ++n)
    for (int v = 0; v < V; ++v) got[static_cast<size_t>(n * V + v)] = logits[n * Vp + v];
  EXPECT_EQ(compare("logits", got.data(), want_logits, 1e-4), 0);
  const double want_loss = g.f.at("loss", kFixture).as_f32()[0];
  EXPECT_NEAR(loss_sum / (B * S), want_loss, 1e-5 * want_loss);
}

// Gradients for the whole batch at once, and accumulated over micro-batches of 1 and 2
// sequences: accumulation must give the same gradient as the big batch.
class GptGoldenGrad : public ::testing::TestWithParam<int> {};

TEST_P(GptGoldenGrad, GradientsMatchAutograd) {
  const int micro = GetParam();
  Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(g.dims, options(), *be);
  load_weights(model, g);
  const int B = g.B, S = g.dims.S;
  const std::vector<int32_t> tok = g.f.at("tokens", kFixture).as_i32();
  model.params().zero_grads();
  for (int first = 0; first < B; first += micro) {
    std::vector<int32_t> part(tok.begin() + first * (S + 1),
                              tok.begin() + (first + micro) * (S + 1));
    Tensor in = be->empty({micro, S}, MemCategory::kActivations, DType::kI32);
    Tensor tg = be->empty({micro, S}, MemCategory::kActivations, DType::kI32);
    split_tokens(part, micro, S, in, tg);
    double s = 0;
    auto acts = forward(model, in, tg, &s);
    model.backward(*acts, 1.0f / static_cast<float>(B * S));
  }
  int bad = 0;
  for (const ParamInfo& p : model.params().infos()) {
    const std::vector<float> want = g.f.at("grad." + p.name, kFixture).as_f32();
    bad += compare("grad." + p.name, model.params().grads().f32() + p.offset, want, 1e-4);
    // Padded vocabulary rows never receive gradient.
    for (int64_t i = static_cast<int64_t>(want.size()); i < p.numel; ++i)
      ASSERT_EQ(model.params().grads().f32()[p.offset + i], 0.0f)
          << p.name << " padded element " << i;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(MicroBatch, GptGoldenGrad, ::testing::Values(4, 2, 1));

// Activation recomputation changes what is kept, never the result: the gradients still match
// PyTorch, and the loss is unchanged.
class GptGoldenRecompute : public ::testing::TestWithParam<Recompute> {};

// Mismatches of every parameter gradient against the fixture's autograd gradients.
int compare_grads(TransformerModel& model, const Golden& g) {
  int bad = 0;
  for (const ParamInfo& p : model.params().infos())
    bad += compare("grad." + p.name, model.params().grads().f32() + p.offset,
                   g.f.at("grad." + p.name, kFixture).as_f32(), 1e-4);
  return bad;
}

TEST_P(GptGoldenRecompute, GradientsMatchAutograd) {
  Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(g.dims, options(GetParam()), *be);
  load_weights(model, g);
  const FixtureBatch b = fixture_batch(*be, g);
  const int tokens = g.B * g.dims.S;
  model.params().zero_grads();
  double s = 0;
  auto acts = forward(model, b.in, b.tg, &s);
  model.backward(*acts, 1.0f / static_cast<float>(tokens));
  const double want_loss = g.f.at("loss", kFixture).as_f32()[0];
  EXPECT_NEAR(s / tokens, want_loss, 1e-5 * want_loss);
  EXPECT_EQ(compare_grads(model, g), 0);
}

// The zero-bubble split: input gradients in the B pass, matrix weight gradients deferred to the W
// pass; together they are the whole gradient.
TEST(GptGolden, DeferredWeightGradientsMatchAutograd) {
  Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(g.dims, options(), *be);
  load_weights(model, g);
  const FixtureBatch b = fixture_batch(*be, g);
  model.params().zero_grads();
  double s = 0;
  auto acts = forward(model, b.in, b.tg, &s);
  model.backward_piece(*acts, Tensor(), 1.0f / static_cast<float>(g.B * g.dims.S), true, true);
  // After B alone the matrices have no gradient yet; LayerNorms already do.
  const ParamStore& ps = model.params();
  EXPECT_EQ(be->sum_squares(ps.grad(ps.layout().find("h.0.mlp.c_fc.weight"))), 0.0);
  EXPECT_GT(be->sum_squares(ps.grad(ps.layout().find("h.0.ln_1.weight"))), 0.0);
  model.backward_weight_piece(*acts, true);
  EXPECT_EQ(compare_grads(model, g), 0);
}

INSTANTIATE_TEST_SUITE_P(Recompute, GptGoldenRecompute,
                         ::testing::Values(Recompute::kSelective, Recompute::kFull));

TEST(GptGolden, TenAdamWStepsMatchPyTorch) {
  Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(g.dims, options(), *be);
  load_weights(model, g);
  const int B = g.B, S = g.dims.S;
  OptimizerConfig o;
  o.lr = g.cfg["lr"];
  o.min_lr = g.cfg["min_lr"];
  o.warmup_iters = g.cfg["warmup_iters"];
  o.decay_iters = g.cfg["decay_iters"].get<int>();
  o.decay = "cosine";
  o.beta1 = g.cfg["beta1"];
  o.beta2 = g.cfg["beta2"];
  o.eps = g.cfg["eps"];
  o.weight_decay = g.cfg["weight_decay"];
  o.grad_clip = g.cfg["grad_clip"];
  const int steps = g.cfg["steps"];
  std::vector<OptSegment> segments;
  for (const ParamInfo& p : model.params().infos())
    segments.push_back({p.offset, p.offset, p.numel, p.decay});
  AdamW opt(*be, o, segments);

  const std::vector<int32_t> all = g.f.at("steps.tokens", kFixture).as_i32();
  const std::vector<float> want_loss = g.f.at("steps.loss", kFixture).as_f32();
  const std::vector<float> want_norm = g.f.at("steps.grad_norm", kFixture).as_f32();
  const std::vector<float> want_lr = g.f.at("steps.lr", kFixture).as_f32();
  for (int k = 0; k < steps; ++k) {
    std::vector<int32_t> tok(all.begin() + k * B * (S + 1), all.begin() + (k + 1) * B * (S + 1));
    Tensor in = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
    Tensor tg = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
    split_tokens(tok, B, S, in, tg);
    model.params().zero_grads();
    double s = 0;
    auto acts = forward(model, in, tg, &s);
    model.backward(*acts, 1.0f / static_cast<float>(B * S));
    const double loss = s / (B * S);
    const double norm = std::sqrt(be->sum_squares(model.params().grads()));
    const double lr = learning_rate(o, steps, k + 1);
    EXPECT_NEAR(loss, want_loss[k], 1e-5 * want_loss[k]) << "step " << k;
    EXPECT_NEAR(norm, want_norm[k], 1e-5 * want_norm[k]) << "step " << k;
    EXPECT_NEAR(lr, want_lr[k], 1e-6 * want_lr[k]) << "step " << k;
    // As the trainer runs it: the clipping coefficient applied inside the AdamW update.
    opt.step(model.params().params(), model.params().grads(), lr,
             clip_coefficient(norm, o.grad_clip));
  }
  int bad = 0;
  for (const ParamInfo& p : model.params().infos()) {
    const std::vector<float> want = g.f.at("final." + p.name, kFixture).as_f32();
    const bool key_bias = p.name.find("attn.c_attn.bias") != std::string::npos;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool key_row =
          key_bias && i >= static_cast<size_t>(g.dims.C) && i < static_cast<size_t>(2 * g.dims.C);
      const double tol = key_row ? 1e-3 : 1e-4;
      const float got = model.params().params().f32()[p.offset + static_cast<int64_t>(i)];
      if (std::fabs(got - want[i]) > tol) {
        if (bad < 5)
          ADD_FAILURE() << "final." << p.name << "[" << i << "]: got " << got << ", want "
                        << want[i];
        ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace strata
