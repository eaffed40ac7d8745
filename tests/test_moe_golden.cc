// Mixtral and Qwen3-MoE forward, backward and 10 AdamW steps against Hugging Face transformers
// (tests/golden/mixtral_tiny.safetensors, qwen3_moe_tiny.safetensors and
// qwen3_moe_dense_tiny.safetensors — Qwen3-MoE with dense layers: decoder_sparse_step 2 and
// mlp_only_layers [1] on 6 layers, mixtures at 3 and 5 — written by
// tests/golden/make_moe_fixture.py: MixtralForCausalLM and Qwen3MoeForCausalLM in float64 with
// output_router_logits, so that their loss is the language-model loss plus router_aux_loss_coef
// times the load-balancing loss, which pools the sparse layers' router logits only). The
// description's parameter count is transformers' model's (the fixture records it). The fixtures'
// tensors have Hugging Face's per-expert names, so they go in through the architecture's adapter
// and Strata's gradients and final weights come back out through it: the adapter's layouts are
// checked against transformers' too.
//
// Tolerances as the Llama golden test's (tests/test_llama_golden.cc, tests/golden/README.md):
// logits, gradients 1e-4 × the largest magnitude in the tensor; losses, the load-balancing term
// and gradient norms 1e-5 relative; final weights 1e-5 absolute but for at most 1 in 10,000
// entries (1e-3): Adam turns float32 noise on gradients near 1e-8 into whole steps, and the
// fixtures' own float32 replay has 7 of 185,280 (Mixtral), 7 of 210,496 (Qwen3-MoE) and 13 of
// 185,984 (Qwen3-MoE with dense layers) entries beyond 1e-5; Strata has 6, 10 and 10.
//
// The dense-layer fixture's ten steps are chaotic: the same Strata code built at -O1 (the
// sanitizer build) and at -O3 rounds differently at step 0 (1e-8 relative in the loss) and the
// two end step 7's gradient norm 1.8e-5 and 4.7e-6 off the reference, with 46 and 10 final entries
// beyond 1e-5 (the fixture's own float32 replay: 3.9e-6 and 13). For that fixture alone the step
// gradient norms are held to 5e-5 and the final entries to 1 in 2,000 beyond 1e-5, which any
// float32 rounding of the recipe meets and a wrong update (a whole step) does not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/model_state.h"
#include "models/layers/embedding.h"
#include "models/registry.h"
#include "models/transformer/lm_head.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/optimizer.h"
#include "runtime/io/safetensors.h"
#include "tests/golden_compare.h"

namespace strata {
namespace {

using golden::compare;
using golden::max_abs;
using golden::max_diff;

struct Golden {
  std::string path;
  StFile f;
  nlohmann::json cfg;
  ModelConfig m;
  int B = 0, S = 0, V = 0, Vp = 0;
  FullTensors hf_weights() const {
    FullTensors t;
    for (const auto& [name, st] : f.tensors)
      if (name.rfind("model.", 0) == 0 || name == "lm_head.weight")
        t[name] = {st.shape, st.as_f32()};
    return t;
  }
  const ArchSpec& arch() const { return architecture(m.arch); }
};

Golden load(const std::string& file) {
  Golden g;
  g.path = std::string(STRATA_TEST_DIR) + "/golden/" + file;
  g.f = read_safetensors(g.path);
  g.cfg = nlohmann::json::parse(g.f.metadata.at("config"));
  ModelConfig& m = g.m;
  m.arch = g.cfg["arch"];
  m.num_layers = g.cfg["num_layers"];
  m.hidden_size = g.cfg["hidden_size"];
  m.num_heads = g.cfg["num_heads"];
  m.num_key_value_heads = g.cfg["num_key_value_heads"].get<int>();
  m.ffn_hidden_size = g.cfg["ffn_hidden_size"];
  m.seq_len = g.cfg["seq_len"];
  m.vocab_size = g.cfg["vocab_size"];
  m.tie_embeddings = g.cfg["tie_embeddings"];
  m.rms_norm_eps = g.cfg["rms_norm_eps"];
  m.rope_theta = g.cfg["rope_theta"];
  m.num_experts = g.cfg["num_experts"];
  m.num_experts_per_tok = g.cfg["num_experts_per_tok"];
  m.moe_intermediate_size = g.cfg["moe_intermediate_size"].get<int>();
  m.norm_topk_prob = g.cfg["norm_topk_prob"];
  m.router_aux_loss_coef = g.cfg["router_aux_loss_coef"];
  if (g.cfg.contains("head_dim") && !g.cfg["head_dim"].is_null() &&
      g.cfg["head_dim"].get<int>() != m.hidden_size / m.num_heads)
    m.head_dim = g.cfg["head_dim"].get<int>();
  m.decoder_sparse_step = g.cfg.value("decoder_sparse_step", 1);
  m.mlp_only_layers = g.cfg.value("mlp_only_layers", std::vector<int>());
  g.B = g.cfg["batch_size"];
  g.S = m.seq_len;
  g.V = m.vocab_size;
  g.Vp = pad_vocab(g.V, 128);
  return g;
}

ModelOptions options() {
  ModelOptions o;
  o.seed = 1;
  return o;
}

void load_weights(TransformerModel& model, const Golden& g) {
  golden::load_full_tensors(model.params(), g.arch().hf.from_hf(g.m, g.hf_weights(), g.path),
                            g.path);
}

FullTensors to_hf(const TransformerModel& model, const Golden& g, const float* flat) {
  return g.arch().hf.to_hf(g.m, golden::full_tensors(model.params(), flat));
}

struct Batch {
  Tensor in, tg;
};
Batch batch(Backend& be, const Golden& g, int k) {
  Batch b{be.empty({g.B, g.S}, MemCategory::kActivations, DType::kI32),
          be.empty({g.B, g.S}, MemCategory::kActivations, DType::kI32)};
  const std::vector<int32_t> in = g.f.at("steps.inputs", g.path).as_i32();
  const std::vector<int32_t> tg = g.f.at("steps.targets", g.path).as_i32();
  const size_t n = static_cast<size_t>(g.B * g.S), at = n * static_cast<size_t>(k);
  std::copy(in.begin() + at, in.begin() + at + n, b.in.i32());
  std::copy(tg.begin() + at, tg.begin() + at + n, b.tg.i32());
  return b;
}

class MoeGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeGolden, ForwardLogitsLossAndBalancingLossMatchTransformers) {
  const Golden g = load(GetParam());
  auto be = make_backend("cpu", 1);
  TransformerModel model(model_spec(g.m), options(), *be);
  load_weights(model, g);
  const Batch b = batch(*be, g, 0);
  LossSum loss;
  PieceActsPtr acts = model.forward(ModelBatch{b.in, b.tg, Tensor()}, &loss);
  const float* logits = lm_logits(*acts).f32();  // (B·S, Vp)
  const std::vector<float> want = g.f.at("logits", g.path).as_f32();
  std::vector<float> got(want.size());
  for (int n = 0; n < g.B * g.S; ++n)
    for (int v = 0; v < g.V; ++v) got[static_cast<size_t>(n * g.V + v)] = logits[n * g.Vp + v];
  EXPECT_EQ(compare("logits", got, want, 1e-4), 0);
  const double want_lm = g.f.at("lm_loss", g.path).as_f32()[0];
  const double want_aux = g.f.at("aux_loss", g.path).as_f32()[0] * g.m.router_aux_loss_coef;
  const double lm = loss.sum / (g.B * g.S);
  EXPECT_NEAR(lm, want_lm, 1e-5 * want_lm);
  EXPECT_NEAR(loss.aux, want_aux, 1e-5 * want_aux);
  std::printf("%s logits: max|diff|/max|ref| %.2e; loss: relative %.2e; aux: relative %.2e\n",
              g.m.arch.c_str(), max_diff(got, want) / max_abs(want),
              std::fabs(lm - want_lm) / want_lm, std::fabs(loss.aux - want_aux) / want_aux);
}

TEST_P(MoeGolden, GradientsOfLossPlusBalancingMatchAutograd) {
  const Golden g = load(GetParam());
  auto be = make_backend("cpu", 1);
  TransformerModel model(model_spec(g.m), options(), *be);
  load_weights(model, g);
  const Batch b = batch(*be, g, 0);
  model.params().zero_grads();
  LossSum loss;
  PieceActsPtr acts = model.forward(ModelBatch{b.in, b.tg, Tensor()}, &loss);
  model.backward(*acts, 1.0f / static_cast<float>(g.B * g.S));
  const FullTensors grads = to_hf(model, g, model.params().grads().f32());
  int bad = 0;
  double worst = 0;
  for (const auto& [name, t] : grads) {
    const std::vector<float> want = g.f.at("grad." + name, g.path).as_f32();
    bad += compare("grad." + name, t.data, want, 1e-4);
    worst = std::max(worst, max_diff(t.data, want) / max_abs(want));
  }
  std::printf("%s gradients (%zu tensors): worst max|diff|/max|ref| %.2e\n", g.m.arch.c_str(),
              grads.size(), worst);
  EXPECT_EQ(bad, 0);
}

TEST_P(MoeGolden, TenAdamWStepsMatchTorch) {
  const Golden g = load(GetParam());
  const bool chaotic = GetParam() == "qwen3_moe_dense_tiny.safetensors";  // see the top
  const double norm_rel = chaotic ? 5e-5 : 1e-5;
  const int per_loose = chaotic ? 2000 : 10000;
  auto be = make_backend("cpu", 1);
  TransformerModel model(model_spec(g.m), options(), *be);
  load_weights(model, g);
  const OptimizerConfig o = golden::optimizer_of(g.cfg);
  const int steps = g.cfg["steps"];
  AdamW opt(*be, o, golden::whole_segments(model.params()));
  const std::vector<float> want_loss = g.f.at("steps.lm_loss", g.path).as_f32();
  const std::vector<float> want_aux = g.f.at("steps.aux_loss", g.path).as_f32();
  const std::vector<float> want_norm = g.f.at("steps.grad_norm", g.path).as_f32();
  for (int k = 0; k < steps; ++k) {
    const Batch b = batch(*be, g, k);
    model.params().zero_grads();
    LossSum l;
    PieceActsPtr acts = model.forward(ModelBatch{b.in, b.tg, Tensor()}, &l);
    model.backward(*acts, 1.0f / static_cast<float>(g.B * g.S));
    const double loss = l.sum / (g.B * g.S);
    const double aux = want_aux[k] * g.m.router_aux_loss_coef;
    const double norm = std::sqrt(be->sum_squares(model.params().grads()));
    const double lr = learning_rate(o, steps, k + 1);
    EXPECT_NEAR(loss, want_loss[k], 1e-5 * want_loss[k]) << "step " << k;
    EXPECT_NEAR(l.aux, aux, 1e-5 * aux) << "step " << k;
    EXPECT_NEAR(norm, want_norm[k], norm_rel * want_norm[k]) << "step " << k;
    opt.step(model.params().params(), model.params().grads(), lr,
             clip_coefficient(norm, o.grad_clip));
  }
  const FullTensors final_weights = to_hf(model, g, model.params().params().f32());
  int bad = 0, loose = 0;
  size_t entries = 0;
  double worst = 0;
  for (const auto& [name, t] : final_weights) {
    entries += t.data.size();
    const std::vector<float> want = g.f.at("final." + name, g.path).as_f32();
    bad += compare("final." + name, t.data, want, 0, 1e-3);
    for (size_t i = 0; i < want.size(); ++i)
      if (std::fabs(t.data[i] - want[i]) > 1e-5) ++loose;
    worst = std::max(worst, max_diff(t.data, want));
  }
  std::printf("%s final weights after %d steps: max|diff| %.2e, %d entries beyond 1e-5\n",
              g.m.arch.c_str(), steps, worst, loose);
  EXPECT_EQ(bad, 0);
  EXPECT_LE(loose, static_cast<int>(entries / static_cast<size_t>(per_loose)))
      << "entries of the final weights further than 1e-5 from the reference";
}

// The description counts the parameters of transformers' model; a mixture's dense layers count
// as dense MLPs (the fixtures of one kind of layer have none).
TEST_P(MoeGolden, DescriptionCountsTransformersParameters) {
  const Golden g = load(GetParam());
  const std::unique_ptr<ModelDescription> d = describe_model(g.m);
  EXPECT_EQ(d->parameters(), g.cfg.at("parameters").get<int64_t>());
  int dense = 0;
  for (int l = 0; l < g.m.num_layers; ++l) dense += !g.m.sparse_layer(l);
  EXPECT_EQ(d->layer_kinds(), dense > 0 ? 2 : 1);
  for (int l = 0; l < g.m.num_layers; ++l)
    EXPECT_EQ(d->layer_kind(l), g.m.sparse_layer(l) ? 0 : 1) << "layer " << l;
  if (dense == 0) return;
  // A dense layer: its attention and norms, and the SwiGLU MLP of ffn_hidden_size (3·F·C).
  const int64_t C = g.m.hidden_size, F = g.m.ffn_hidden_size, E = g.m.num_experts,
                Fe = g.m.expert_hidden();
  EXPECT_EQ(d->layer_parameters(1, 0) - d->layer_parameters(1, 1),
            E * C + E * 3 * Fe * C - 3 * F * C);
  EXPECT_EQ(d->layer_expert_parameters(1, 1), 0);
  EXPECT_EQ(d->layer_expert_parameters(1, 0), E * 3 * Fe * C);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeGolden,
                         ::testing::Values("mixtral_tiny.safetensors", "qwen3_moe_tiny.safetensors",
                                           "qwen3_moe_dense_tiny.safetensors"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return std::string(p.param.rfind("mixtral", 0) == 0 ? "Mixtral"
                                              : p.param.find("dense") != std::string::npos
                                                  ? "Qwen3MoeDense"
                                                  : "Qwen3Moe");
                         });

}  // namespace
}  // namespace strata
