// Llama and Qwen2 forward, backward and 10 AdamW steps against Hugging Face transformers
// (tests/golden/llama_tiny.safetensors and qwen2_tiny.safetensors, written by
// tests/golden/make_llama_fixture.py [--arch qwen2]: its LlamaForCausalLM / Qwen2ForCausalLM in
// float64). The fixture's tensors have Hugging Face's names and layouts, so they go in through
// the architecture's adapter (from_hf) and Strata's gradients and final weights come back out
// through its to_hf: the adapter's layouts are checked against transformers' too.
//
// Tolerances, and why (tests/golden/README.md):
//  * logits, loss, gradients: 1e-4 × the largest magnitude in the tensor. The fixture's float32
//    replay stays within 9.3e-7 of the float64 reference; a wrong layout (k and v blocks swapped,
//    RoPE on the wrong pairs, a query head reading another group's key/value head) moves them by
//    1e-2 or more.
//  * step losses and gradient norms: 1e-5 relative.
//  * final weights: 1e-5 absolute but for at most 10 of the 74,176 entries, which get 1e-3. Adam
//    turns the float32 noise of a gradient ~1e-8 into whole steps: the fixture's float32 replay
//    has a handful of entries beyond 2e-6, the worst 1.2e-5 away; Strata has 4 beyond 5e-6, the
//    worst (the same entry, whose gradient is 5e-8) 5.6e-5. A wrong update moves every entry.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/model_state.h"
#include "models/layers/embedding.h"
#include "models/llama/llama.h"
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

// The fixture of the architecture under test (the parameter: "llama" or "qwen2").
class LlamaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string fixture_ =
      std::string(STRATA_TEST_DIR) + "/golden/" + GetParam() + "_tiny.safetensors";
};

struct Golden {
  StFile f;
  nlohmann::json cfg;
  ModelConfig m;
  int B = 0, S = 0, V = 0, Vp = 0;
  // The initial weights (Hugging Face's names: model.* and lm_head.weight).
  FullTensors hf_weights() const {
    FullTensors t;
    for (const auto& [name, st] : f.tensors)
      if (name.rfind("model.", 0) == 0 || name == "lm_head.weight")
        t[name] = {st.shape, st.as_f32()};
    return t;
  }
};

Golden load(const std::string& fixture) {
  Golden g;
  g.f = read_safetensors(fixture);
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

TransformerSpec spec(const Golden& g) {
  return architecture(g.m.arch).spec(g.m);
}

// The fixture's initial weights, through the adapter, into the model's flat parameters.
void load_weights(TransformerModel& model, const Golden& g, const std::string& fixture) {
  golden::load_full_tensors(
      model.params(), architecture(g.m.arch).hf.from_hf(g.m, g.hf_weights(), fixture), fixture);
}

FullTensors to_hf(const TransformerModel& model, const Golden& g, const float* flat) {
  return architecture(g.m.arch).hf.to_hf(g.m, golden::full_tensors(model.params(), flat));
}

struct Batch {
  Tensor in, tg;
};
// Step k's batch (k = 0 is the fixture's `inputs` / `targets`).
Batch batch(Backend& be, const Golden& g, int k, const std::string& fixture) {
  Batch b{be.empty({g.B, g.S}, MemCategory::kActivations, DType::kI32),
          be.empty({g.B, g.S}, MemCategory::kActivations, DType::kI32)};
  const std::vector<int32_t> in = g.f.at("steps.inputs", fixture).as_i32();
  const std::vector<int32_t> tg = g.f.at("steps.targets", fixture).as_i32();
  const size_t n = static_cast<size_t>(g.B * g.S), at = n * static_cast<size_t>(k);
  std::copy(in.begin() + at, in.begin() + at + n, b.in.i32());
  std::copy(tg.begin() + at, tg.begin() + at + n, b.tg.i32());
  return b;
}

TEST_P(LlamaGolden, ForwardLogitsAndLossMatchTransformers) {
  const Golden g = load(fixture_);
  auto be = make_backend("cpu", 1);
  TransformerModel model(spec(g), options(), *be);
  load_weights(model, g, fixture_);
  const Batch b = batch(*be, g, 0, fixture_);
  LossSum loss;
  PieceActsPtr acts = model.forward(ModelBatch{b.in, b.tg, Tensor()}, &loss);
  const float* logits = lm_logits(*acts).f32();  // (B·S, Vp)
  const std::vector<float> want = g.f.at("logits", fixture_).as_f32();
  std::vector<float> got(want.size());
  for (int n = 0; n < g.B * g.S; ++n)
    for (int v = 0; v < g.V; ++v) got[static_cast<size_t>(n * g.V + v)] = logits[n * g.Vp + v];
  EXPECT_EQ(compare("logits", got, want, 1e-4), 0);
  const double want_loss = g.f.at("loss", fixture_).as_f32()[0];
  EXPECT_NEAR(loss.sum / (g.B * g.S), want_loss, 1e-5 * want_loss);
  std::printf("logits: max|diff|/max|ref| %.2e; loss: relative %.2e\n",
              max_diff(got, want) / max_abs(want),
              std::fabs(loss.sum / (g.B * g.S) - want_loss) / want_loss);
}

TEST_P(LlamaGolden, GradientsMatchAutograd) {
  const Golden g = load(fixture_);
  auto be = make_backend("cpu", 1);
  TransformerModel model(spec(g), options(), *be);
  load_weights(model, g, fixture_);
  const Batch b = batch(*be, g, 0, fixture_);
  model.params().zero_grads();
  LossSum loss;
  PieceActsPtr acts = model.forward(ModelBatch{b.in, b.tg, Tensor()}, &loss);
  model.backward(*acts, 1.0f / static_cast<float>(g.B * g.S));
  const FullTensors grads = to_hf(model, g, model.params().grads().f32());
  int bad = 0;
  double worst = 0;
  for (const auto& [name, t] : grads) {
    const std::vector<float> want = g.f.at("grad." + name, fixture_).as_f32();
    bad += compare("grad." + name, t.data, want, 1e-4);
    worst = std::max(worst, max_diff(t.data, want) / max_abs(want));
  }
  std::printf("gradients: worst max|diff|/max|ref| %.2e\n", worst);
  // Llama's 21 tensors; Qwen2's biases on q, k and v add 3 a layer.
  EXPECT_EQ(grads.size(), g.m.arch == "qwen2" ? 27u : 21u);
  EXPECT_EQ(bad, 0);
}

TEST_P(LlamaGolden, TenAdamWStepsMatchTorch) {
  const Golden g = load(fixture_);
  auto be = make_backend("cpu", 1);
  TransformerModel model(spec(g), options(), *be);
  load_weights(model, g, fixture_);
  const OptimizerConfig o = golden::optimizer_of(g.cfg);
  const int steps = g.cfg["steps"];
  AdamW opt(*be, o, golden::whole_segments(model.params()));
  const std::vector<float> want_loss = g.f.at("steps.loss", fixture_).as_f32();
  const std::vector<float> want_norm = g.f.at("steps.grad_norm", fixture_).as_f32();
  const std::vector<float> want_lr = g.f.at("steps.lr", fixture_).as_f32();
  for (int k = 0; k < steps; ++k) {
    const Batch b = batch(*be, g, k, fixture_);
    model.params().zero_grads();
    LossSum l;
    PieceActsPtr acts = model.forward(ModelBatch{b.in, b.tg, Tensor()}, &l);
    model.backward(*acts, 1.0f / static_cast<float>(g.B * g.S));
    const double loss = l.sum / (g.B * g.S);
    const double norm = std::sqrt(be->sum_squares(model.params().grads()));
    const double lr = learning_rate(o, steps, k + 1);
    EXPECT_NEAR(loss, want_loss[k], 1e-5 * want_loss[k]) << "step " << k;
    EXPECT_NEAR(norm, want_norm[k], 1e-5 * want_norm[k]) << "step " << k;
    EXPECT_NEAR(lr, want_lr[k], 1e-6 * want_lr[k]) << "step " << k;
    opt.step(model.params().params(), model.params().grads(), lr,
             clip_coefficient(norm, o.grad_clip));
  }
  const FullTensors final_weights = to_hf(model, g, model.params().params().f32());
  int bad = 0, loose = 0, key_bias_loose = 0;
  double worst = 0;
  for (const auto& [name, t] : final_weights) {
    const std::vector<float> want = g.f.at("final." + name, fixture_).as_f32();
    bad += compare("final." + name, t.data, want, 0, 1e-3);
    // Qwen2's key bias: a shift every key of a head shares leaves the softmax as it was, so its
    // gradient comes only from RoPE rotating it differently at each position; at rope_theta 1e6
    // the slow pairs barely turn over 16 positions and their gradient is float32 noise, which
    // Adam makes whole steps of (the fixture's own float32 replay ends 2.8e-4 away). Held to
    // 1e-3 (above), not counted with the rest.
    const bool key_bias =
        name.size() > 11 && name.compare(name.size() - 11, 11, "k_proj.bias") == 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (std::fabs(t.data[i] - want[i]) > 1e-5) ++(key_bias ? key_bias_loose : loose);
    worst = std::max(worst, max_diff(t.data, want));
  }
  std::printf(
      "final weights after %d steps: max|diff| %.2e, %d entries beyond 1e-5 (and %d of "
      "the key biases)\n",
      steps, worst, loose, key_bias_loose);
  EXPECT_EQ(bad, 0);
  EXPECT_LE(loose, 10) << "entries of the final weights further than 1e-5 from the reference";
}

INSTANTIATE_TEST_SUITE_P(Arch, LlamaGolden, ::testing::Values("llama", "qwen2", "mistral"));

}  // namespace
}  // namespace strata
