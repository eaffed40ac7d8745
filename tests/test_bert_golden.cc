// BERT forward, backward and 10 AdamW steps against Hugging Face transformers
// (tests/golden/bert_tiny.safetensors, written by tests/golden/make_bert_fixture.py: its
// BertForPreTraining in float64 on batches with padding). The fixture's tensors have Hugging
// Face's names and layouts, so they go in through bert_from_hf and Strata's gradients and final
// weights come back out through bert_to_hf: the adapter's layouts are checked against
// transformers' too. The batches go in as a masked-LM source would give them: the token ids
// (padding [PAD]), token types, lengths (the key padding mask), the masked positions as the loss
// mask with their labels as targets, the next-sentence labels, and the sentence loss weight
// (masked tokens per sequence) that makes Σ losses / masked tokens Hugging Face's
// masked_lm_loss + next_sentence_loss.
//
// Tolerances, and why:
//  * logits (masked LM, every position, padded ones included; next sentence), loss, gradients:
//    1e-4 × the largest magnitude in the tensor. The fixture's float32 replay stays within
//    9.8e-7 of the float64 reference; a wrong layout (q/k/v blocks swapped, a padding key
//    attended, token types or positions added wrongly, the tanh GELU for the erf one) moves them
//    by 1e-3 or more.
//  * the attention key biases' gradients: their exact value is 0 (adding q·b_k to every score
//    of a row leaves its softmax unchanged), so what any float implementation computes is
//    rounding noise (the fixture's float32 replay: 8.4e-10 against a largest gradient of 0.71):
//    at most 1e-6 of the largest gradient.
//  * step losses and gradient norms: 1e-5 relative.
//  * final weights, key biases apart: 1e-5 absolute but for at most 10 entries, which get 1e-3.
//    Adam turns float32 noise in a small gradient into whole steps (the fixture's float32
//    replay: 6.2e-6 at most). The key biases' gradient being noise only, Adam moves them by
//    noise-driven steps of up to lr each (the replay: 1.0e-3 from the reference): they only
//    need to stay within Σ lr = 0.055 of their start, i.e. nothing but noise moved them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/model_state.h"
#include "models/bert/bert.h"
#include "models/layers/embedding.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/optimizer.h"
#include "runtime/io/safetensors.h"
#include "tests/golden_compare.h"

namespace strata {
namespace {

using golden::compare;
using golden::max_abs;
using golden::max_diff;

const std::string kFixture = std::string(STRATA_TEST_DIR) + "/golden/bert_tiny.safetensors";

struct Golden {
  StFile f;
  nlohmann::json cfg;
  ModelConfig m;
  int B = 0, S = 0, V = 0, Vp = 0;
  FullTensors hf_weights() const {
    FullTensors t;
    for (const auto& [name, st] : f.tensors)
      if (name.rfind("bert.", 0) == 0 || name.rfind("cls.", 0) == 0)
        t[name] = {st.shape, st.as_f32()};
    return t;
  }
};

Golden load() {
  Golden g;
  g.f = read_safetensors(kFixture);
  g.cfg = nlohmann::json::parse(g.f.metadata.at("config"));
  ModelConfig& m = g.m;
  m.arch = "bert";
  m.num_layers = g.cfg["num_layers"];
  m.hidden_size = g.cfg["hidden_size"];
  m.num_heads = g.cfg["num_heads"];
  m.ffn_hidden_size = g.cfg["ffn_hidden_size"];
  m.seq_len = g.cfg["seq_len"];
  m.vocab_size = g.cfg["vocab_size"];
  m.type_vocab_size = g.cfg["type_vocab_size"];
  m.layer_norm_eps = g.cfg["layer_norm_eps"];
  m.tie_embeddings = true;
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
  golden::load_full_tensors(model.params(), bert_from_hf(g.m, g.hf_weights(), kFixture), kFixture);
}

FullTensors to_hf(const TransformerModel& model, const Golden& g, const float* flat) {
  return bert_to_hf(g.m, golden::full_tensors(model.params(), flat));
}

// Step k's batch (k = 0: the fixture's logits, loss and gradients are of it), as ModelBatch;
// *masked: the positions its loss counts.
ModelBatch batch(Backend& be, const Golden& g, int k, double* masked) {
  const size_t n = static_cast<size_t>(g.B * g.S);
  const auto slice = [&](const char* name, size_t per) {
    const std::vector<int32_t> all = g.f.at(name, kFixture).as_i32();
    return std::vector<int32_t>(all.begin() + static_cast<int64_t>(per * k),
                                all.begin() + static_cast<int64_t>(per * (k + 1)));
  };
  const std::vector<int32_t> ids = slice("steps.input_ids", n),
                             types = slice("steps.token_type_ids", n),
                             att = slice("steps.attention_mask", n),
                             labels = slice("steps.labels", n),
                             nsp = slice("steps.next_sentence_label", static_cast<size_t>(g.B));
  std::vector<int32_t> targets(n), lengths(static_cast<size_t>(g.B), 0);
  std::vector<float> mask(n);
  *masked = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool counted = labels[i] != -100;
    targets[i] = counted ? labels[i] : 0;
    mask[i] = counted ? 1.0f : 0.0f;
    *masked += counted;
    lengths[i / static_cast<size_t>(g.S)] += att[i];
  }
  const auto put = [&be](const Shape& s, DType t, const void* host) {
    Tensor x = be.empty(s, MemCategory::kActivations, t);
    be.upload(x, host);
    return x;
  };
  ModelBatch b;
  b.tokens = put({g.B, g.S}, DType::kI32, ids.data());
  b.targets = put({g.B, g.S}, DType::kI32, targets.data());
  b.loss_mask = put({g.B, g.S}, DType::kF32, mask.data());
  b.token_types = put({g.B, g.S}, DType::kI32, types.data());
  b.key_lengths = put({g.B}, DType::kI32, lengths.data());
  b.sentence_labels = put({g.B}, DType::kI32, nsp.data());
  b.sentence_loss_weight = *masked / g.B;
  return b;
}

bool key_bias(const std::string& name) {
  const std::string s = "attention.self.key.bias";
  return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
}

TEST(BertGolden, LogitsAndLossMatchTransformers) {
  const Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(bert_spec(g.m), options(), *be);
  load_weights(model, g);
  double masked = 0;
  const ModelBatch b = batch(*be, g, 0, &masked);
  LossSum loss;
  PieceActsPtr acts = model.forward(b, &loss);
  const float* mlm = bert_mlm_logits(*acts).f32();  // (B·S, Vp)
  const std::vector<float> want = g.f.at("mlm_logits", kFixture).as_f32();
  std::vector<float> got(want.size());
  for (int n = 0; n < g.B * g.S; ++n)
    for (int v = 0; v < g.V; ++v) got[static_cast<size_t>(n * g.V + v)] = mlm[n * g.Vp + v];
  EXPECT_EQ(compare("mlm logits", got, want, 1e-4), 0);
  const Tensor& nsp = bert_sentence_logits(*acts);
  const std::vector<float> nsp_got(nsp.f32(), nsp.f32() + nsp.numel());
  const std::vector<float> nsp_want = g.f.at("nsp_logits", kFixture).as_f32();
  EXPECT_EQ(compare("nsp logits", nsp_got, nsp_want, 1e-4), 0);
  const double want_loss = g.f.at("loss", kFixture).as_f32()[0];
  EXPECT_EQ(loss.count, masked) << "the loss counts the masked positions only";
  EXPECT_NEAR(loss.sum / loss.count, want_loss, 1e-5 * want_loss);
  std::printf(
      "mlm logits: max|diff|/max|ref| %.2e; nsp logits %.2e; loss: relative %.2e "
      "(%g masked positions)\n",
      max_diff(got, want) / max_abs(want), max_diff(nsp_got, nsp_want) / max_abs(nsp_want),
      std::fabs(loss.sum / loss.count - want_loss) / want_loss, masked);
}

TEST(BertGolden, GradientsMatchAutograd) {
  const Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(bert_spec(g.m), options(), *be);
  load_weights(model, g);
  double masked = 0;
  const ModelBatch b = batch(*be, g, 0, &masked);
  model.params().zero_grads();
  LossSum loss;
  PieceActsPtr acts = model.forward(b, &loss);
  model.backward(*acts, static_cast<float>(1.0 / masked));
  const FullTensors grads = to_hf(model, g, model.params().grads().f32());
  double largest = 0;
  for (const auto& [name, t] : grads)
    largest = std::max(largest, max_abs(g.f.at("grad." + name, kFixture).as_f32()));
  int bad = 0;
  double worst = 0, key_bias_worst = 0;
  for (const auto& [name, t] : grads) {
    const std::vector<float> want = g.f.at("grad." + name, kFixture).as_f32();
    if (key_bias(name)) {
      bad += compare("grad." + name, t.data, want, 0, 1e-6 * largest);
      key_bias_worst = std::max(key_bias_worst, max_abs(t.data));
      continue;
    }
    bad += compare("grad." + name, t.data, want, 1e-4);
    worst = std::max(worst, max_diff(t.data, want) / max_abs(want));
  }
  std::printf(
      "gradients: worst max|diff|/max|ref| %.2e; key biases |grad| at most %.2e "
      "(largest gradient %.2e)\n",
      worst, key_bias_worst, largest);
  EXPECT_EQ(grads.size(), 5u + 16u * 2 + 9u);  // embeddings, 2 layers, heads
  EXPECT_EQ(bad, 0);
}

TEST(BertGolden, TenAdamWStepsMatchTorch) {
  const Golden g = load();
  auto be = make_backend("cpu", 1);
  TransformerModel model(bert_spec(g.m), options(), *be);
  load_weights(model, g);
  const FullTensors initial = g.hf_weights();
  const OptimizerConfig o = golden::optimizer_of(g.cfg);
  const int steps = g.cfg["steps"];
  AdamW opt(*be, o, golden::whole_segments(model.params()));
  const std::vector<float> want_loss = g.f.at("steps.loss", kFixture).as_f32();
  const std::vector<float> want_norm = g.f.at("steps.grad_norm", kFixture).as_f32();
  const std::vector<float> want_lr = g.f.at("steps.lr", kFixture).as_f32();
  double lr_sum = 0;
  for (int k = 0; k < steps; ++k) {
    double masked = 0;
    const ModelBatch b = batch(*be, g, k, &masked);
    model.params().zero_grads();
    LossSum l;
    PieceActsPtr acts = model.forward(b, &l);
    model.backward(*acts, static_cast<float>(1.0 / masked));
    const double loss = l.sum / l.count;
    const double norm = std::sqrt(be->sum_squares(model.params().grads()));
    const double lr = learning_rate(o, steps, k + 1);
    lr_sum += lr;
    EXPECT_NEAR(loss, want_loss[k], 1e-5 * want_loss[k]) << "step " << k;
    EXPECT_NEAR(norm, want_norm[k], 1e-5 * want_norm[k]) << "step " << k;
    EXPECT_NEAR(lr, want_lr[k], 1e-6 * want_lr[k]) << "step " << k;
    opt.step(model.params().params(), model.params().grads(), lr,
             clip_coefficient(norm, o.grad_clip));
  }
  const FullTensors final_weights = to_hf(model, g, model.params().params().f32());
  int bad = 0, loose = 0;
  double worst = 0, key_bias_moved = 0;
  for (const auto& [name, t] : final_weights) {
    if (key_bias(name)) {
      const std::vector<float>& start = initial.at(name).data;
      bad += compare("final." + name, t.data, start, 0, lr_sum);
      key_bias_moved = std::max(key_bias_moved, max_diff(t.data, start));
      continue;
    }
    const std::vector<float> want = g.f.at("final." + name, kFixture).as_f32();
    bad += compare("final." + name, t.data, want, 0, 1e-3);
    for (size_t i = 0; i < want.size(); ++i)
      if (std::fabs(t.data[i] - want[i]) > 1e-5) ++loose;
    worst = std::max(worst, max_diff(t.data, want));
  }
  std::printf(
      "final weights after %d steps: max|diff| %.2e, %d entries beyond 1e-5; key biases "
      "moved at most %.2e (bound Σ lr = %.3f)\n",
      steps, worst, loose, key_bias_moved, lr_sum);
  EXPECT_EQ(bad, 0);
  EXPECT_LE(loose, 10) << "entries of the final weights further than 1e-5 from the reference";
}

}  // namespace
}  // namespace strata
