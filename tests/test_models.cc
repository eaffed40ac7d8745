// The model registry and the self-description (models/registry.h, models/description.h) against
// outside references: Hugging Face's parameter counts of the GPT-2 checkpoints and Megatron-LM's
// closed-form FLOP count; and the registry's contract (every architecture the config accepts
// can be described and built, an unknown one is a config error naming the known ones).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "models/registry.h"
#include "partitioner/layer_split.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

// GPT2LMHeadModel(GPT2Config(...)).num_parameters() for the four published sizes (gpt2,
// gpt2-medium, gpt2-large, gpt2-xl: tied head, 1024 positions, vocabulary 50257).
TEST(ModelDescription, GptParameterCountsMatchHuggingFace) {
  const struct {
    const char* preset;
    int64_t hf;
  } cases[] = {{"gpt2-124m", 124439808},
               {"gpt2-350m", 354823168},
               {"gpt2-774m", 774030080},
               {"gpt2-1.5b", 1557611200}};
  for (const auto& c : cases) {
    const Config cfg = load_config("", {std::string("model.preset=") + c.preset});
    EXPECT_EQ(describe_model(cfg.model)->parameters(), c.hf) << c.preset;
  }
}

// Megatron-LM's count for one iteration (Narayanan et al. 2021, eq. 3, an MLP of 4h):
// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), and with full recomputation (one more forward of every
// layer) 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
TEST(ModelDescription, GptFlopsAreMegatronsClosedForm) {
  for (const char* preset : {"gpt3-1.3b", "gpt3-13b", "gpt3-175b"}) {
    const Config cfg = load_config("", {std::string("model.preset=") + preset});
    const double B = 1536, s = cfg.model.seq_len, l = cfg.model.num_layers,
                 h = cfg.model.hidden_size, V = cfg.model.vocab_size;
    ASSERT_EQ(cfg.model.ffn_hidden_size, 4 * cfg.model.hidden_size) << preset;
    const std::unique_ptr<ModelDescription> d = describe_model(cfg.model);
    const double model = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    const double full = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    EXPECT_NEAR(d->flops_per_iteration(B, Recompute::kNone).model / model, 1.0, 1e-12) << preset;
    EXPECT_NEAR(d->flops_per_iteration(B, Recompute::kFull).hardware / full, 1.0, 1e-12) << preset;
    // Selective recomputation repeats the attention core's forward: 4·B·s²·h per layer.
    EXPECT_NEAR(d->flops_per_iteration(B, Recompute::kSelective).hardware,
                model + 4 * B * s * s * h * l, 1e-9 * model)
        << preset;
  }
}

// Every name model.arch accepts has a description and builds a model whose parameters are the
// ones its description counts.
TEST(ModelRegistry, EveryArchitectureDescribesAndBuilds) {
  ASSERT_FALSE(architecture_names().empty());
  const std::unique_ptr<Backend> be = make_backend("cpu", 1);
  for (const std::string& name : architecture_names()) {
    const Config cfg = load_config("", {"model.preset=tiny", "model.arch=" + name});
    const std::unique_ptr<ModelDescription> d = describe_model(cfg.model);
    EXPECT_EQ(d->arch(), name);
    ModelOptions o;
    o.seed = 1;
    const std::unique_ptr<Model> m = build_model(cfg.model, o, *be);
    EXPECT_EQ(m->params().numel(), piece_parameters(*d, 1, 0, 1, 0, d->num_layers())) << name;
    EXPECT_FALSE(architecture(name).hf.hf_class.empty()) << name;
  }
}

// parameters() counts the first layer's piece and every other layer by its kind (a layout of
// every layer made a million-layer config take 40 s): the same as the built model's parameters
// less the padded vocabulary rows (unpadded_parameters), for every architecture, with the first
// layer of another kind (Qwen3-MoE's mlp_only_layers) and for 16.7 M layers in well under a second.
TEST(ModelDescription, ParameterCountIsTheBuiltModelsLessThePadding) {
  const std::unique_ptr<Backend> be = make_backend("cpu", 1);
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"model.preset=tiny"},
           {"model.preset=tiny", "model.num_layers=5"},
           {"model.preset=llama-tiny", "model.num_layers=3"},
           {"model.preset=bert-tiny"},
           {"model.preset=mixtral-tiny"},
           {"model.preset=qwen3-moe-tiny", "model.num_layers=4", "model.mlp_only_layers=[0]"},
           {"model.preset=qwen3-moe-tiny", "model.num_layers=5", "model.decoder_sparse_step=2"}}) {
    std::string name;
    for (const std::string& s : sets) name += s + " ";
    const Config cfg = load_config("", sets);
    const std::unique_ptr<ModelDescription> d = describe_model(cfg.model);
    ModelOptions o;
    o.seed = 1;
    const std::unique_ptr<Model> m = build_model(cfg.model, o, *be);
    EXPECT_EQ(d->parameters(), unpadded_parameters(m->params().layout())) << name;
  }
  const Config huge = load_config("", {"model.preset=tiny", "model.num_layers=16777217"});
  const std::unique_ptr<ModelDescription> d = describe_model(huge.model);
  const Config one = load_config("", {"model.preset=tiny", "model.num_layers=1"});
  const Config two = load_config("", {"model.preset=tiny", "model.num_layers=2"});
  const int64_t layer =
      describe_model(two.model)->parameters() - describe_model(one.model)->parameters();
  EXPECT_EQ(d->parameters(), describe_model(one.model)->parameters() + 16777216 * layer);
}

TEST(ModelRegistry, UnknownArchitectureIsAConfigErrorNamingTheKnownOnes) {
  try {
    load_config("", {"model.arch=mamba"});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "model.arch");
    for (const std::string& name : architecture_names())
      EXPECT_NE(e.expected().find("\"" + name + "\""), std::string::npos) << e.expected();
  }
}

// The split training, the dry run and the planner's prediction of a config share
// (partitioner/layer_split.h; tests/mpi_test_layout.cc checks that they do).
TEST(LayerSplit, EvenSplitPutsTheExtraLayersFirstAndAnExplicitSplitWins) {
  EXPECT_EQ(split_layers_even(10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(split_layers_even(12, 4), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(split_layers_even(7, 4), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(layer_split(10, 4, std::nullopt), split_layers_even(10, 4));
  EXPECT_EQ(layer_split(10, 4, std::vector<int>{1, 4, 3, 2}), (std::vector<int>{1, 4, 3, 2}));
  EXPECT_EQ(split_text({3, 4, 4, 1}), "3 4 4 1");
}

}  // namespace
}  // namespace strata
