// The mixture-of-experts MLP (models/layers/moe.h) and the models made of it (mixtral, qwen3_moe)
// on one rank, against references that do not share its code path:
//   * the layer's output against the definition computed here in double from its weights —
//     router softmax, top-k with ties to the lower expert, renormalised or not, SwiGLU experts,
//     the weighted sum — dropless and with a capacity factor (the assignments of the largest
//     weights kept per expert, ties to the lower token);
//   * the gradients of a whole model's objective (token losses plus coef · the load-balancing
//     loss · tokens, moe.h) by the backward against finite differences: the router, both expert
//     weights, q_norm (Qwen3-MoE) and an embedding row, with a coefficient large enough that a
//     missing load-balancing gradient shows;
//   * greedy decoding over the cache against the training forward;
//   * the Hub's per-expert tensors and config.json, there and back, and their refusals (Qwen3-MoE
//     with dense layers too: their Llama MLP tensors, decoder_sparse_step, mlp_only_layers);
//   * Qwen3-MoE's dense layers: which layers are dense (Hugging Face's rule), their gradients
//     with the balancing loss over the sparse layers only, decoding, and their description
//     (dense MLPs' parameters, FLOPs and work, priced apart by the planner);
//   * the refusals of bad mixture keys (one line naming the key).
// The backend ops are test_moe_ops's; Hugging Face's own numbers (the load-balancing loss
// included) are test_moe_golden's; the
// tensor and data layouts mpi_test_parallel's (STRATA_TEST_ARCH=mixtral, qwen3_moe).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/config/model_shape.h"
#include "launch/config/world_layout.h"
#include "models/hf_checkpoint.h"
#include "models/layers/moe.h"
#include "models/mixtral/mixtral.h"
#include "models/qwen3_moe/qwen3_moe.h"
#include "models/registry.h"
#include "partitioner/planner.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"
#include "tests/decode_check.h"

namespace strata {
namespace {

struct LayerCase {
  bool renormalize = true;
  std::optional<double> capacity;
};

// One MoE layer on a (B, S, C) input: its output against the definition in double.
void check_layer(const LayerCase& c) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  MoeSpec m;
  m.experts = 4;
  m.top_k = 2;
  m.hidden = 6;
  m.renormalize = c.renormalize;
  m.capacity_factor = c.capacity;
  const int64_t C = 8, B = 2, S = 5, N = B * S, E = m.experts, F = m.hidden, k = m.top_k;
  ParamLayout layout(1, 0);
  const MixtureOfExperts moe(layout, m, {"router", "gate_up", "down"}, C, 0.5, 0.5);
  ParamStore store(std::move(layout), *be, false, 3);
  TensorParallel tp(*be, nullptr, 1, 0, false, DType::kF32);
  const LayerEnv env{*be, store, tp, DType::kF32};
  Tensor x = be->empty({B, S, C}, MemCategory::kActivations);
  Tensor residual = be->empty({B, S, C}, MemCategory::kActivations);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.f32()[i] = static_cast<float>(std::sin(0.37 * i + 0.2) * 1.5);
    residual.f32()[i] = static_cast<float>(std::cos(0.11 * i));
  }
  MixtureOfExperts::Saved s;
  MixtureOfExperts::Stats stats;
  const Tensor out = moe.forward(env, x, residual, s, &stats);

  const float* wr = store.params().f32() + store.info(moe.router).offset;
  const float* wgu = store.params().f32() + store.info(moe.gate_up).offset;
  const float* wd = store.params().f32() + store.info(moe.down).offset;
  std::vector<double> want(static_cast<size_t>(N * C), 0.0);
  std::vector<std::vector<std::pair<double, int64_t>>> kept(static_cast<size_t>(E));  // (w, n)
  std::vector<std::vector<double>> weights(static_cast<size_t>(N));
  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(N));
  std::vector<double> routed(static_cast<size_t>(E), 0.0), prob_sum(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x.f32() + n * C;
    std::vector<double> p(static_cast<size_t>(E));
    double mx = -1e300;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t i = 0; i < C; ++i) l += double{wr[e * C + i]} * xn[i];
      p[e] = l;
      mx = std::max(mx, l);
    }
    double z = 0;
    for (double& v : p) z += (v = std::exp(v - mx));
    for (int64_t e = 0; e < E; ++e) prob_sum[e] += (p[e] /= z);
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      chosen[n].push_back(order[j]);
      weights[n].push_back(c.renormalize ? p[order[j]] / sum : p[order[j]]);
      routed[order[j]] += 1;
      kept[order[j]].push_back({weights[n].back(), n});
    }
  }
  // The capacity: per expert the assignments of the largest weights, ties to the lower token.
  const int64_t cap = m.capacity(N);
  std::vector<std::vector<bool>> keep(static_cast<size_t>(N), std::vector<bool>(k, true));
  int64_t dropped = 0;
  if (cap >= 0) {
    for (int64_t e = 0; e < E; ++e) {
      auto& list = kept[e];
      std::stable_sort(list.begin(), list.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (size_t i = static_cast<size_t>(cap); i < list.size(); ++i) {
        const int64_t n = list[i].second;
        for (int64_t j = 0; j < k; ++j)
          if (chosen[n][j] == e) keep[n][j] = false;
        ++dropped;
      }
    }
    EXPECT_GT(dropped, 0) << "the capacity case should drop something";
  }
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x.f32() + n * C;
    for (int64_t j = 0; j < k; ++j) {
      if (!keep[n][j]) continue;
      const int64_t e = chosen[n][j];
      std::vector<double> act(static_cast<size_t>(F));
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < C; ++i) {
          g += double{wgu[(e * 2 * F + f) * C + i]} * xn[i];
          u += double{wgu[(e * 2 * F + F + f) * C + i]} * xn[i];
        }
        act[f] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < C; ++o) {
        double y = 0;
        for (int64_t f = 0; f < F; ++f) y += double{wd[(e * C + o) * F + f]} * act[f];
        want[n * C + o] += weights[n][j] * y;
      }
    }
  }
  int bad = 0;
  for (int64_t i = 0; i < N * C; ++i) {
    const double w = want[i] + residual.f32()[i];
    if (std::fabs(out.f32()[i] - w) > 1e-5 * (1 + std::fabs(w))) ++bad;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(stats.tokens, N);
  EXPECT_EQ(stats.dropped, dropped);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(stats.routed[e], routed[e]) << "expert " << e;
    EXPECT_NEAR(stats.prob_sum[e], prob_sum[e], 1e-5) << "expert " << e;
  }
}

TEST(Moe, LayerFollowsTheDefinitionRenormalised) {
  check_layer({true, std::nullopt});
}

TEST(Moe, LayerFollowsTheDefinitionWithoutRenormalising) {
  check_layer({false, std::nullopt});
}

TEST(Moe, LayerDropsPastTheCapacityByWeight) {
  check_layer({true, 0.5});
}

// A tiny model of `arch` with a load-balancing coefficient large enough to matter.
struct MoeModel {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ModelConfig cfg;
  TransformerSpec spec;
  std::unique_ptr<TransformerModel> model;
  Tensor tokens, targets;
  int64_t B = 2, S = 8;
  explicit MoeModel(const std::string& preset, std::vector<std::string> sets = {}) {
    sets.insert(sets.begin(), {"model.preset=" + preset, "model.init_std=0.2", "model.seq_len=8",
                               "model.router_aux_loss_coef=0.5"});
    cfg = load_config("", sets).model;
    spec = model_spec(cfg);
    ModelOptions o;
    o.seed = 5;
    model = std::make_unique<TransformerModel>(spec, o, *be);
    tokens = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
    targets = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
    for (int i = 0; i < B * S; ++i) {
      tokens.i32()[i] = (11 * i + 3) % spec.V;
      targets.i32()[i] = (7 * i + 1) % spec.V;
    }
  }
  // The objective whose gradient the backward computes at scale 1: Σ token losses plus
  // coef · aux · tokens (moe.h).
  double objective() {
    LossSum l;
    model->forward(ModelBatch{tokens, targets}, &l);
    return l.sum + l.aux * static_cast<double>(B * S);
  }
};

// Every element of a few weights: backward against a fourth-order finite-difference stencil.
void check_gradients(MoeModel& m, const std::vector<std::string>& names, int per_tensor) {
  ParamStore& store = m.model->params();
  store.zero_grads();
  {
    LossSum l;
    PieceActsPtr acts = m.model->forward(ModelBatch{m.tokens, m.targets}, &l);
    EXPECT_GT(l.aux, 0);
    m.model->backward(*acts, 1.0f);
  }
  const std::vector<float> grads(store.grads().f32(), store.grads().f32() + store.numel());
  int checked = 0, bad = 0, kinks = 0;
  for (const std::string& name : names) {
    const ParamRef ref = store.layout().find(name);
    ASSERT_TRUE(ref.valid()) << name;
    const ParamInfo& info = store.info(ref);
    const int64_t step = std::max<int64_t>(1, info.numel / per_tensor);
    for (int64_t i = 0; i < info.numel; i += step) {
      float& w = store.params().f32()[info.offset + i];
      const float w0 = w;
      const double h = 1e-2;
      auto at = [&](double d) {
        w = static_cast<float>(w0 + d);
        store.params_changed();
        return m.objective();
      };
      const double up = at(h), down = at(-h), up2 = at(2 * h), down2 = at(-2 * h);
      const double half = (at(h / 2) - at(-h / 2)) / h;
      w = w0;
      store.params_changed();
      // Top-k routing is piecewise: a step that moves a token across a tie between experts
      // swaps an expert (a jump), where no difference quotient is a derivative. Central
      // differences at h/2, h and 2h then disagree by far more than their truncation; such an
      // element is skipped (and counted: at most one in five).
      const double central = (up - down) / (2 * h), wide = (up2 - down2) / (4 * h);
      const auto apart = [](double a, double b) {
        return std::fabs(a - b) > 0.1 * std::fabs(b) + 0.05;
      };
      if (apart(central, half) || apart(wide, half)) {
        ++kinks;
        continue;
      }
      const double fd = (8 * (up - down) - (up2 - down2)) / (12 * h);
      const double g = grads[static_cast<size_t>(info.offset + i)];
      ++checked;
      if (std::fabs(g - fd) > 2e-2 * std::fabs(fd) + 2e-3) {
        ++bad;
        ADD_FAILURE() << name << "[" << i << "]: backward " << g << ", differences " << fd;
      }
    }
  }
  std::printf("%d elements checked, %d skipped at a routing jump\n", checked, kinks);
  EXPECT_LE(kinks, checked / 5);
  EXPECT_GE(checked, static_cast<int>(names.size()) * 4);
  EXPECT_EQ(bad, 0);
}

TEST(Moe, MixtralGradientsMatchFiniteDifferences) {
  MoeModel m("mixtral-tiny");
  check_gradients(m,
                  {"layers.0.block_sparse_moe.gate.weight", "layers.1.block_sparse_moe.gate.weight",
                   "layers.0.block_sparse_moe.experts.gate_up_proj.weight",
                   "layers.1.block_sparse_moe.experts.down_proj.weight", "embed_tokens"},
                  24);
}

TEST(Moe, Qwen3MoeGradientsMatchFiniteDifferences) {
  MoeModel m("qwen3-moe-tiny", {"model.norm_topk_prob=false"});
  check_gradients(m,
                  {"layers.0.mlp.gate.weight", "layers.1.mlp.experts.gate_up_proj.weight",
                   "layers.0.mlp.experts.down_proj.weight", "layers.1.self_attn.q_norm.weight"},
                  24);
}

// Qwen3-MoE with dense layers (3 layers, decoder_sparse_step 2: layer 1 a mixture, 0 and 2
// dense): the dense MLPs' gradients, and the router's with the balancing loss over the one
// sparse layer (L = 1: a gradient scaled for all 3 layers would be off by 3×).
TEST(Moe, Qwen3MoeDenseLayersGradientsMatchFiniteDifferences) {
  MoeModel m("qwen3-moe-tiny",
             {"model.norm_topk_prob=false", "model.num_layers=3", "model.decoder_sparse_step=2"});
  ASSERT_EQ(m.spec.kinds(), 2);
  check_gradients(m,
                  {"layers.1.mlp.gate.weight", "layers.1.mlp.experts.gate_up_proj.weight",
                   "layers.0.mlp.gate_up_proj.weight", "layers.2.mlp.down_proj.weight",
                   "layers.0.self_attn.q_norm.weight"},
                  24);
}

// Greedy decoding over the key/value cache (the router per new token) picks the training
// forward's argmax at every position.
TEST(Moe, DecodingOverTheCacheFollowsTheTrainingForward) {
  for (const char* preset : {"mixtral-tiny", "qwen3-moe-tiny", "qwen3-dense"}) {
    SCOPED_TRACE(preset);
    const bool dense = std::string(preset) == "qwen3-dense";
    MoeModel m(dense ? "qwen3-moe-tiny" : preset,
               dense ? std::vector<std::string>{"model.num_layers=3", "model.mlp_only_layers=[0,2]"}
                     : std::vector<std::string>{});
    expect_decoding_follows_forward(*m.model, *m.be, m.spec.V, {5, 9, 2}, 5);
  }
}

// Hugging Face's Qwen3MoeDecoderLayer: layer i sparse iff i is not in mlp_only_layers and
// (i + 1) % decoder_sparse_step == 0; the spec's kinds follow it, with the dense layers' names.
TEST(Moe, DenseLayersFollowHuggingFacesRule) {
  ModelConfig m = load_config("", {"model.preset=qwen3-moe-tiny", "model.num_layers=6",
                                   "model.decoder_sparse_step=2", "model.mlp_only_layers=[1]"})
                      .model;
  const std::vector<bool> want = {false, false, false, true, false, true};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(m.sparse_layer(l), want[static_cast<size_t>(l)]) << l;
  const TransformerSpec spec = model_spec(m);
  ASSERT_EQ(spec.kinds(), 2);
  EXPECT_EQ(spec.moe_layers(), 2);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(spec.kind_of(l), want[static_cast<size_t>(l)] ? 0 : 1);
  const BlockSpec& dense = spec.kind_block(1);
  EXPECT_FALSE(dense.mlp.is_moe());
  EXPECT_EQ(dense.mlp.hidden, m.ffn_hidden_size);
  EXPECT_EQ(dense.names.mlp_fc, "mlp.gate_up_proj");
  EXPECT_EQ(dense.names.mlp_proj, "mlp.down_proj");
  const ParamLayout layout = model_layout(m, 1, 0, false, whole_model(6));
  EXPECT_TRUE(layout.find("layers.0.mlp.gate_up_proj.weight").valid());
  EXPECT_FALSE(layout.find("layers.0.mlp.gate.weight").valid());
  EXPECT_TRUE(layout.find("layers.3.mlp.gate.weight").valid());
  EXPECT_FALSE(layout.find("layers.3.mlp.gate_up_proj.weight").valid());
  // The defaults: every layer a mixture, one kind (the spec of the parent commit).
  m.decoder_sparse_step = 1;
  m.mlp_only_layers.clear();
  EXPECT_EQ(model_spec(m).kinds(), 1);
  EXPECT_TRUE(model_spec(m).layer_kind.empty());
}

// Our fused experts to the Hub's per-expert tensors and back, exactly; config.json written for
// the class and read back to the same model keys; a directory without one expert's tensor
// refused naming it. Qwen3-MoE with dense layers (4 layers, decoder_sparse_step 2,
// mlp_only_layers [3, 0]: layer 1 its only mixture) the same way, its dense layers' MLPs as Llama's
// gate_proj / up_proj / down_proj; config.json carries the two keys, and another set of dense
// layers or another intermediate_size is refused naming the key.
TEST(Moe, HuggingFaceTensorsAndConfigRoundTrip) {
  struct Case {
    std::string preset;
    std::vector<std::string> sets;
  };
  const std::vector<std::string> dense_sets = {"model.num_layers=4", "model.decoder_sparse_step=2",
                                               "model.mlp_only_layers=[3,0]"};
  for (const Case& k :
       {Case{"mixtral-tiny", {}}, Case{"qwen3-moe-tiny", {}}, Case{"qwen3-moe-tiny", dense_sets}}) {
    const bool dense = !k.sets.empty();
    SCOPED_TRACE(k.preset + (dense ? " with dense layers" : ""));
    std::vector<std::string> sets = {"model.preset=" + k.preset};
    sets.insert(sets.end(), k.sets.begin(), k.sets.end());
    const ModelConfig m = load_config("", sets).model;
    const ArchSpec& arch = architecture(m.arch);
    const ParamLayout layout = model_layout(m, 1, 0, false, whole_model(m.num_layers));
    FullTensors ours;
    float x = 0.5f;
    for (const ParamInfo& p : layout.infos()) {
      FullTensor t{p.full_shape, std::vector<float>(static_cast<size_t>(p.numel))};
      for (float& v : t.data) v = (x = std::fmod(x * 1.37f + 0.11f, 2.0f)) - 1.0f;
      ours[p.name] = std::move(t);
    }
    const FullTensors hf = arch.hf.to_hf(m, ours);
    const std::string moe = m.arch == "mixtral" ? "block_sparse_moe" : "mlp";
    const std::string down = m.arch == "mixtral" ? "w2" : "down_proj";
    const std::string expert = "model.layers.1." + moe + ".experts.3." + down + ".weight";
    ASSERT_TRUE(hf.count(expert)) << expert;
    EXPECT_EQ(hf.at(expert).shape, (Shape{m.hidden_size, m.expert_hidden()}));
    if (dense) {
      // Layers 0, 2 and 3 dense: Llama's three projections of ffn_hidden_size, no router.
      for (int l : {0, 2, 3}) {
        const std::string h = "model.layers." + std::to_string(l) + ".mlp.";
        ASSERT_TRUE(hf.count(h + "gate_proj.weight")) << h;
        EXPECT_EQ(hf.at(h + "gate_proj.weight").shape, (Shape{m.ffn_hidden_size, m.hidden_size}));
        EXPECT_EQ(hf.at(h + "down_proj.weight").shape, (Shape{m.hidden_size, m.ffn_hidden_size}));
        EXPECT_FALSE(hf.count(h + "gate.weight")) << h;
        EXPECT_FALSE(hf.count(h + "experts.0.up_proj.weight")) << h;
      }
      EXPECT_FALSE(hf.count("model.layers.1.mlp.gate_proj.weight"));
    }
    // Every name of the state-dict order is there, and nothing else.
    const std::vector<std::string> order = arch.hf.hf_order(m);
    EXPECT_EQ(order.size(), hf.size());
    for (const std::string& n : order) EXPECT_TRUE(hf.count(n)) << n;
    const FullTensors back = arch.hf.from_hf(m, hf, "d");
    ASSERT_EQ(back.size(), ours.size());
    for (const auto& [name, t] : ours) {
      ASSERT_TRUE(back.count(name)) << name;
      // The vocabulary comes back without its padding rows (the model pads it on loading).
      const FullTensor& b = back.at(name);
      EXPECT_EQ(b.shape.back(), t.shape.back()) << name;
      EXPECT_TRUE(std::equal(b.data.begin(), b.data.end(), t.data.begin())) << name;
      if (name != "embed_tokens" && name != "lm_head.weight") {
        EXPECT_EQ(b.data.size(), t.data.size()) << name;
      }
    }
    for (const std::string& gone :
         {expert, std::string(dense ? "model.layers.2.mlp.up_proj.weight" : expert)}) {
      FullTensors missing = hf;
      missing.erase(gone);
      try {
        arch.hf.from_hf(m, missing, "dir/model.safetensors");
        ADD_FAILURE() << "a missing tensor was accepted: " << gone;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(gone), std::string::npos) << e.what();
      }
    }
    const nlohmann::json c = arch.hf.hf_config(m);
    EXPECT_NO_THROW(arch.hf.check_hf_config(m, c, "d/config.json"));
    const ModelConfig read = arch.hf.model_config(c, "d/config.json");
    EXPECT_EQ(read.num_experts, m.num_experts);
    EXPECT_EQ(read.num_experts_per_tok, m.num_experts_per_tok);
    EXPECT_EQ(read.expert_hidden(), m.expert_hidden());
    EXPECT_EQ(read.head_size(), m.head_size());
    EXPECT_EQ(read.norm_topk_prob, m.norm_topk_prob);
    EXPECT_EQ(read.router_aux_loss_coef, m.router_aux_loss_coef);
    EXPECT_EQ(read.decoder_sparse_step, m.decoder_sparse_step);
    EXPECT_EQ(read.mlp_only_layers, m.mlp_only_layers);
    EXPECT_EQ(read.ffn_hidden_size, m.ffn_hidden_size);
    nlohmann::json other = c;
    other[m.arch == "mixtral" ? "num_local_experts" : "num_experts"] = m.num_experts + 1;
    EXPECT_THROW(arch.hf.check_hf_config(m, other, "d/config.json"), InputError);
    if (m.arch != "qwen3_moe") continue;
    EXPECT_EQ(c.at("decoder_sparse_step"), m.decoder_sparse_step);
    EXPECT_EQ(c.at("mlp_only_layers"), nlohmann::json(m.mlp_only_layers));
    // Another set of dense layers (or another width of them) is another model.
    const auto refused_at = [&](const nlohmann::json& cfg) -> std::string {
      try {
        arch.hf.check_hf_config(m, cfg, "d/config.json");
      } catch (const InputError& e) {
        return e.what();
      }
      return "";
    };
    nlohmann::json more_dense = c;
    more_dense["mlp_only_layers"] = {3};
    EXPECT_NE(refused_at(more_dense).find("mlp_only_layers"), std::string::npos);
    nlohmann::json step = c;
    step["decoder_sparse_step"] = dense ? 1 : 2;
    EXPECT_NE(refused_at(step).find("decoder_sparse_step"), std::string::npos);
    nlohmann::json beyond = c;
    beyond["mlp_only_layers"] = {m.num_layers};
    EXPECT_NE(refused_at(beyond).find("mlp_only_layers"), std::string::npos);
    if (dense) {
      nlohmann::json width = c;
      width["intermediate_size"] = m.ffn_hidden_size + 2;
      EXPECT_NE(refused_at(width).find("intermediate_size"), std::string::npos);
      // The same dense layers in another order are the same model.
      nlohmann::json permuted = c;
      permuted["mlp_only_layers"] = {0, 3};
      EXPECT_EQ(refused_at(permuted), "");
    }
  }
}

// model.init_from of a directory with a router on a dense layer (or a dense layer's MLP on a
// sparse one) refuses the tensor by name, as any tensor the model has no place for.
TEST(Moe, DenseLayerDirectoryWithAnUnexpectedTensorIsRefused) {
  const ModelConfig m = load_config("", {"model.preset=qwen3-moe-tiny", "model.num_layers=3",
                                         "model.decoder_sparse_step=2"})
                            .model;
  const ArchSpec& arch = architecture(m.arch);
  const ParamLayout layout = model_layout(m, 1, 0, false, whole_model(m.num_layers));
  FullTensors ours;
  for (const ParamInfo& p : layout.infos())
    ours[p.name] =
        FullTensor{p.full_shape, std::vector<float>(static_cast<size_t>(p.numel), 0.25f)};
  const std::string dir = ::testing::TempDir() + "strata_qwen3_dense_hf";
  for (const std::string& extra : {std::string(""), std::string("model.layers.0.mlp.gate.weight"),
                                   std::string("model.layers.1.mlp.gate_proj.weight")}) {
    SCOPED_TRACE(extra);
    std::filesystem::remove_all(dir);
    FullTensors hf = arch.hf.to_hf(m, ours);
    if (!extra.empty())
      hf[extra] =
          FullTensor{{m.num_experts, m.hidden_size},
                     std::vector<float>(static_cast<size_t>(m.num_experts * m.hidden_size))};
    write_hf_directory(dir, arch.hf.hf_config(m), hf, HfWriteOptions{});
    if (extra.empty()) {
      const FullTensors loaded = load_hf_model(m, dir);
      EXPECT_EQ(loaded.size(), ours.size());
      continue;
    }
    try {
      load_hf_model(m, dir);
      ADD_FAILURE() << "an unexpected tensor was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(extra), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

// The self-description: every expert's parameters counted (Mixtral-8x7B is 46.7B), the active
// experts' FLOPs only (a dense model of the same shape with k experts' width, plus the router),
// and a pipeline split refused while the balancing loss couples the layers.
TEST(Moe, DescriptionCountsEveryExpertAndTheActiveFlops) {
  const ModelConfig big = load_config("", {"model.preset=mixtral-8x7b"}).model;
  EXPECT_EQ(describe_model(big)->parameters(), 46702792704);  // Mixtral-8x7B-v0.1's count
  const ModelConfig m = load_config("", {"model.preset=mixtral-tiny"}).model;
  const int64_t C = m.hidden_size, E = m.num_experts, F = m.expert_hidden(), L = m.num_layers;
  ModelConfig dense = load_config("", {"model.preset=llama-tiny"}).model;
  dense.hidden_size = m.hidden_size;
  dense.num_heads = m.num_heads;
  dense.num_key_value_heads = m.num_key_value_heads;
  dense.num_layers = m.num_layers;
  dense.seq_len = m.seq_len;
  dense.vocab_size = m.vocab_size;
  dense.rope_theta = m.rope_theta;
  dense.ffn_hidden_size = m.num_experts_per_tok * F;
  const auto moe = describe_model(m), same = describe_model(dense);
  // Parameters: E experts of 3·F·C and a router of E·C per layer instead of one MLP of 3·F·C.
  EXPECT_EQ(moe->parameters() - same->parameters(),
            L * (E * 3 * F * C + E * C - int64_t{m.num_experts_per_tok} * 3 * F * C));
  // FLOPs: the router's 2·C·E per token (×3 forward and backward) on top of the dense model's.
  const double tokens = 4.0 * m.seq_len;
  EXPECT_NEAR(moe->flops_per_iteration(4, Recompute::kNone).model -
                  same->flops_per_iteration(4, Recompute::kNone).model,
              3 * 2.0 * C * E * tokens * L,
              1e-6 * moe->flops_per_iteration(4, Recompute::kNone).model);
}

// Qwen3-MoE's dense layers are described as dense MLPs: per-kind parameters (no experts, so
// nothing an expert group divides), FLOPs of their MLP instead of the router and the active
// experts, no all-to-all under expert parallelism; pieces count the kinds of layer they hold.
TEST(Moe, DescriptionCountsDenseLayersAsDenseMlps) {
  const std::vector<std::string> base = {"model.preset=qwen3-moe-tiny", "model.num_layers=4"};
  std::vector<std::string> with = base;
  with.insert(with.end(), {"model.decoder_sparse_step=2"});  // layers 1, 3 sparse; 0, 2 dense
  const ModelConfig m = load_config("", with).model, all = load_config("", base).model;
  const auto d = describe_model(m), sparse = describe_model(all);
  const int64_t C = m.hidden_size, E = m.num_experts, Fe = m.expert_hidden(), F = m.ffn_hidden_size,
                k = m.num_experts_per_tok;
  ASSERT_EQ(d->layer_kinds(), 2);
  EXPECT_EQ(sparse->layer_kinds(), 1);
  for (int t : {1, 2}) {
    // Kind 0 is the mixture, as every layer of the all-sparse model; kind 1 a dense layer.
    EXPECT_EQ(d->layer_parameters(t, 0), sparse->layer_parameters(t, 0));
    EXPECT_EQ(d->layer_parameters(t, 0) - d->layer_parameters(t, 1),
              E * C + (E * 3 * Fe * C - 3 * F * C) / t);
    EXPECT_EQ(d->layer_expert_parameters(t, 1), 0);
    // A piece's count is its layers' (checked against the layout it declares).
    for (const ModelPiece& pc : {ModelPiece{0, 1, true, false}, ModelPiece{1, 2, false, false},
                                 ModelPiece{2, 2, false, true}}) {
      const int64_t n = model_layout(m, t, 0, false, {pc}).numel();
      const int piece = pc.embedding ? 0 : pc.head ? 2 : 1;
      EXPECT_EQ(piece_parameters(*d, t, piece, 3, pc.first_layer, pc.num_layers), n)
          << "t " << t << " layers from " << pc.first_layer;
    }
    const RankParameters r = rank_parameters(*d, t, 2, 0, 1, 0, 4);
    EXPECT_EQ(r.expert, 2 * d->layer_expert_parameters(t, 0) / 2);
  }
  EXPECT_EQ(sparse->parameters() - d->parameters(), 2 * (E * C + E * 3 * Fe * C - 3 * F * C));
  // FLOPs: two layers with a dense MLP (2·C·3F a token) instead of the router and k experts.
  const double tokens = 4.0 * m.seq_len;
  EXPECT_NEAR(sparse->flops_per_iteration(4, Recompute::kNone).model -
                  d->flops_per_iteration(4, Recompute::kNone).model,
              3 * 2 * tokens * (2.0 * C * E + k * 2.0 * C * 3 * Fe - 2.0 * C * 3 * F),
              1e-9 * sparse->flops_per_iteration(4, Recompute::kNone).model);
  // Expert parallelism: the mixture's all-to-alls, none in a dense layer.
  const RankShape ep{1, false, 2};
  const auto all_to_alls = [](const PartWork& w) {
    int n = 0;
    for (const Collective& c : w.collectives_fwd) n += c.group == CommGroup::kExpert;
    for (const Collective& c : w.collectives_bwd) n += c.group == CommGroup::kExpert;
    return n;
  };
  EXPECT_GT(all_to_alls(d->layer_work(2, ep, 0)), 0);
  EXPECT_EQ(all_to_alls(d->layer_work(2, ep, 1)), 0);
  // q/k/v, the attention's projection, [gate; up] and down; the mixture adds its router.
  EXPECT_EQ(d->layer_work(2, ep, 1).gemms.size(), 4u);
  EXPECT_EQ(d->layer_work(2, ep, 0).gemms.size(), 5u);
  EXPECT_LT(d->layer_activations(2, ep, Recompute::kNone, false, 1).saved,
            d->layer_activations(2, ep, Recompute::kNone, false, 0).saved);
  EXPECT_NE(d->summary().find("2 of the layers dense, ffn 96"), std::string::npos) << d->summary();
}

// The planner prices each kind of layer apart: a stage of dense layers is cheaper than one of
// mixtures, so the exact pass's split gives the dense half of the model more layers, and the
// stage's memory counts the activations of the layers it holds.
TEST(Moe, PlannerPricesDenseLayersApart) {
  // 8 layers, the first 4 dense (mlp_only_layers, ffn 1024), the others mixtures of 16 experts
  // of 2048, 8 a token: a mixture's layer about 7 times a dense one's FLOPs.
  const ModelConfig m =
      load_config(
          "", {"model.preset=qwen3-moe-tiny", "model.num_layers=8", "model.seq_len=1024",
               "model.hidden_size=1024", "model.num_heads=8", "model.head_dim=128",
               "model.ffn_hidden_size=1024", "model.num_experts=16", "model.num_experts_per_tok=8",
               "model.moe_intermediate_size=2048", "model.mlp_only_layers=[0,1,2,3]"})
          .model;
  const std::shared_ptr<const ModelDescription> d = describe_model(m);
  const Cluster cl = cluster_from_json(
      {{"name", "one"},
       {"nodes", 1},
       {"gpus_per_node", 2},
       {"peak_flops", {{"bf16", 1e15}}},
       {"memory_bytes", 80e9},
       {"hbm_bandwidth", 3e12},
       {"intra_node", {{"bandwidth", 100e9}, {"latency_s", 1e-5}, {"efficiency", 0.5}}},
       {"inter_node", {{"bandwidth", 10e9}, {"latency_s", 2e-5}, {"efficiency", 1.0}}},
       {"nics_per_node", 2}},
      "<test>");
  ParallelLayout c;
  c.pipeline = 2;
  c.data = 1;
  c.micro_batch_size = 1;
  c.num_microbatches = 4;
  const CostContext ctx{d.get(), &cl, "bf16", nullptr, strata_runtime(false, "bf16")};
  const std::vector<LayerTimes> kinds = kind_times(ctx, c);
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_LT(kinds[1].layer_fwd + kinds[1].layer_bwd, kinds[0].layer_fwd + kinds[0].layer_bwd);
  PlanRequest req;
  req.model = d;
  req.cluster = cl;
  req.global_batch_size = 4;
  const PlanResult r = evaluate_plan(req, c);
  ASSERT_EQ(r.config.layers_per_piece.size(), 2u);
  EXPECT_GT(r.config.layers_per_piece[0], r.config.layers_per_piece[1]);
  // The even split's stage 1 holds the 4 mixtures, stage 0 the 4 dense layers: its activations
  // are those of its layers (the rest of the stage's figures alike on both).
  c.layers_per_piece = {4, 4};
  MemoryOptions o;
  o.precision = "bf16";
  const std::vector<MemoryBreakdown> mem = stage_memory(*d, c, o, {1, 1});
  const RankShape rs{1, false, 1};
  const ActivationElems dense = d->layer_activations(1, rs, Recompute::kNone, o.flash_attention, 1),
                        moe = d->layer_activations(1, rs, Recompute::kNone, o.flash_attention, 0);
  const ActivationElems head = d->head_activations(1, rs);
  const double transient_0 = dense.transient;
  const double transient_1 = std::max(head.transient, moe.transient - head.freed_before_layers);
  EXPECT_DOUBLE_EQ(mem[0].activations, (4 * dense.saved + d->piece_input_elems(1, rs) +
                                        d->embedding_activations(1, rs).saved + transient_0) *
                                           2);
  EXPECT_DOUBLE_EQ(mem[1].activations,
                   (4 * moe.saved + d->piece_input_elems(1, rs) + head.saved + transient_1) * 2);
}

// The line a config of `sets` is refused with, on a world of its tensor × pipeline ranks ("" when
// it is not).
std::string refusal(const std::vector<std::string>& sets, int data = 1) {
  try {
    const Config c = load_config("", sets);
    validate_for_world(c, c.layout.tensor * c.layout.pipeline * data);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Moe, BadKeysAreRefusedNamingTheKey) {
  EXPECT_NE(refusal({"model.preset=mixtral-tiny", "model.num_experts_per_tok=5"})
                .find("model.num_experts_per_tok"),
            std::string::npos);
  EXPECT_NE(refusal({"model.preset=mixtral-tiny", "model.num_experts=0"}).find("model.num_experts"),
            std::string::npos);
  EXPECT_NE(refusal({"model.preset=mixtral-tiny", "model.num_experts_per_tok=0"})
                .find("model.num_experts_per_tok"),
            std::string::npos);
  EXPECT_NE(refusal({"model.preset=mixtral-tiny", "model.moe_capacity_factor=0"})
                .find("model.moe_capacity_factor"),
            std::string::npos);
  EXPECT_NE(refusal({"model.preset=mixtral-tiny", "model.norm_topk_prob=false"})
                .find("model.norm_topk_prob"),
            std::string::npos);
  EXPECT_NE(refusal({"model.preset=llama-tiny", "model.num_experts=4"}).find("model.num_experts"),
            std::string::npos);
  // The balancing loss crosses pipeline stages (Model::boundary_stats): no refusal.
  EXPECT_EQ(refusal({"model.preset=mixtral-tiny", "parallel.pipeline=2"}), "");
  EXPECT_NE(refusal({"model.preset=qwen3-moe-tiny", "model.moe_intermediate_size=49",
                     "parallel.tensor=2"})
                .find("model.moe_intermediate_size"),
            std::string::npos);
  EXPECT_EQ(
      refusal({"model.preset=mixtral-tiny", "parallel.pipeline=2", "model.router_aux_loss_coef=0"}),
      "");
  EXPECT_EQ(refusal({"model.preset=qwen3-moe-tiny", "parallel.tensor=2",
                     "parallel.sequence_parallel=true"}),
            "");
  // Expert parallelism: it divides num_experts and the data-parallel size, and needs experts.
  const std::string three = refusal({"model.preset=mixtral-tiny", "parallel.expert=3"}, 6);
  EXPECT_NE(three.find("parallel.expert"), std::string::npos) << three;
  EXPECT_NE(three.find("num_experts 4"), std::string::npos) << three;
  const std::string data = refusal({"model.preset=mixtral-tiny", "parallel.expert=4",
                                    "train.global_batch_size=8", "train.micro_batch_size=1"},
                                   2);
  EXPECT_NE(data.find("parallel.expert"), std::string::npos) << data;
  EXPECT_NE(data.find("data-parallel size 2"), std::string::npos) << data;
  EXPECT_NE(refusal({"model.preset=llama-tiny", "parallel.expert=2"}, 2).find("parallel.expert"),
            std::string::npos);
  EXPECT_NE(refusal({"model.preset=mixtral-tiny", "parallel.expert=0"}).find("parallel.expert"),
            std::string::npos);
  EXPECT_EQ(refusal({"model.preset=mixtral-tiny", "parallel.expert=2", "parallel.tensor=2",
                     "train.global_batch_size=8", "train.micro_batch_size=1"},
                    4),
            "");
  // Qwen3-MoE's dense layers: a step ≥ 1, distinct layers of the model, at least one mixture
  // left; the keys are qwen3_moe's alone.
  const auto names = [](const std::string& line, const std::string& key) {
    EXPECT_NE(line.find(key), std::string::npos) << line;
  };
  const std::string q = "model.preset=qwen3-moe-tiny";  // 2 layers
  EXPECT_EQ(refusal({q, "model.decoder_sparse_step=2"}), "");
  EXPECT_EQ(refusal({q, "model.mlp_only_layers=[1]", "parallel.tensor=2", "parallel.expert=2",
                     "train.global_batch_size=8", "train.micro_batch_size=1"},
                    2),
            "");
  names(refusal({q, "model.decoder_sparse_step=0"}), "model.decoder_sparse_step");
  names(refusal({q, "model.decoder_sparse_step=-1"}), "model.decoder_sparse_step");
  names(refusal({q, "model.mlp_only_layers=[2]"}), "model.mlp_only_layers");
  names(refusal({q, "model.mlp_only_layers=[2]"}), "num_layers is 2");
  names(refusal({q, "model.mlp_only_layers=[0,0]"}), "model.mlp_only_layers");
  names(refusal({q, "model.mlp_only_layers=[-1]"}), "model.mlp_only_layers");
  names(refusal({q, "model.mlp_only_layers=3"}), "model.mlp_only_layers");
  names(refusal({q, "model.mlp_only_layers=[0,1]"}), "model.mlp_only_layers");
  names(refusal({q, "model.decoder_sparse_step=3"}), "model.decoder_sparse_step");
  names(refusal({"model.preset=mixtral-tiny", "model.decoder_sparse_step=2"}),
        "model.decoder_sparse_step");
  names(refusal({"model.preset=mixtral-tiny", "model.mlp_only_layers=[0]"}),
        "model.mlp_only_layers");
  names(refusal({"model.preset=llama-tiny", "model.mlp_only_layers=[0]"}), "model.mlp_only_layers");
  names(refusal({"model.preset=tiny", "model.decoder_sparse_step=2"}), "model.decoder_sparse_step");
  // The dense layers' width splits over the tensor group too (named at the key --set gave last,
  // parallel.tensor, with both values).
  names(
      refusal({q, "model.decoder_sparse_step=2", "model.ffn_hidden_size=95", "parallel.tensor=2"}),
      "parallel.tensor: ffn_hidden_size 95 is not divisible by tensor 2");
}

// A Qwen3-MoE checkpoint recorded before its dense layers had keys (no decoder_sparse_step, no
// mlp_only_layers in run_state.json's model) resumes into a config of every layer sparse, and
// only into that.
TEST(Moe, CheckpointsRecordedBeforeDenseLayersStillResume) {
  const ModelConfig m = load_config("", {"model.preset=qwen3-moe-tiny"}).model;
  const nlohmann::json want = model_shape_json(m, *describe_model(m));
  nlohmann::json old = want;
  old.erase("decoder_sparse_step");
  old.erase("mlp_only_layers");
  EXPECT_NO_THROW(check_model_shape(want, old, "run_state.json", "config"));
  nlohmann::json dense = want;
  dense["decoder_sparse_step"] = 2;
  EXPECT_THROW(check_model_shape(dense, old, "run_state.json", "config"), InputError);
}

}  // namespace
}  // namespace strata
