// The reusable layers of models/layers/ driven through a whole model (the registry's tiny GPT on
// the CPU backend): what a layer promises the model interface, checked against references that
// do not share its code path.
//
// The loss mask (VocabParallelCrossEntropy): ModelBatch.loss_mask zeroes positions; their
// targets are −100 (PyTorch's ignore_index). References:
//   * per-position losses from the unmasked model alone: attention is causal, so position p's
//     loss depends on tokens [0, p] only, and the loss sum of a sequence cut to p + 1 tokens
//     minus that of the sequence cut to p tokens is position p's loss (one sequence per run);
//   * an all-ones mask against no mask: the same arithmetic (w · x = x for w = 1), bit for bit;
//   * central finite differences of the masked loss sum for the weight the backward says
//     matters most.
// Also: fused weights split by row blocks of unequal sizes (GQA's q/k/v), and the rotary
// frequencies against Hugging Face's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "launch/config/config_parse.h"
#include "models/layers/params.h"
#include "models/layers/rope.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"

namespace strata {
namespace {

constexpr int32_t kIgnoreIndex = -100;

struct Fixture {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ModelConfig cfg = load_config("", {"model.preset=tiny"}).model;
  std::unique_ptr<Model> model;
  Fixture() {
    ModelOptions o;
    o.seed = 1234;
    model = build_model(cfg, o, *be);
  }
  Tensor i32(int B, int S) { return be->empty({B, S}, MemCategory::kActivations, DType::kI32); }
  // Σ of the token losses of one forward (no backward).
  LossSum loss(const Tensor& tokens, const Tensor& targets, const Tensor& mask) {
    LossSum l;
    model->forward(ModelBatch{tokens, targets, mask}, &l);
    return l;
  }
  // The gradients of Σ of the counted tokens' losses (backward scale 1), from zero.
  std::vector<float> grads(const Tensor& tokens, const Tensor& targets, const Tensor& mask,
                           LossSum* l) {
    model->params().zero_grads();
    PieceActsPtr acts = model->forward(ModelBatch{tokens, targets, mask}, l);
    model->backward(*acts, 1.0f);
    const Tensor& g = model->params().grads();
    return std::vector<float>(g.f32(), g.f32() + g.numel());
  }
};

TEST(LossMask, MaskedLossIsTheSumOfTheKeptPositionsLosses) {
  Fixture f;
  const int B = 2, S = 24, V = f.cfg.vocab_size;
  Tensor tokens = f.i32(B, S), targets = f.i32(B, S), ignored = f.i32(B, S);
  Tensor mask = f.be->empty({B, S}, MemCategory::kActivations);
  Tensor ones = f.be->empty({B, S}, MemCategory::kActivations);
  int kept = 0;
  for (int i = 0; i < B * S; ++i) {
    tokens.i32()[i] = static_cast<int32_t>(mix64(300 + static_cast<uint64_t>(i)) % V);
    targets.i32()[i] = static_cast<int32_t>(mix64(700 + static_cast<uint64_t>(i)) % V);
    // Every third position, and the second sequence's last 6 (as padding would be).
    const bool keep = i % 3 != 0 && !(i / S == 1 && i % S >= S - 6);
    mask.f32()[i] = keep ? 1.f : 0.f;
    ones.f32()[i] = 1.f;
    ignored.i32()[i] = keep ? targets.i32()[i] : kIgnoreIndex;
    kept += keep;
  }

  // Position (b, p)'s loss from the unmasked model: the prefix [0, p] of sequence b minus the
  // prefix [0, p).
  std::vector<double> position_loss(static_cast<size_t>(B * S));
  for (int b = 0; b < B; ++b) {
    double before = 0;
    for (int len = 1; len <= S; ++len) {
      Tensor tk = f.i32(1, len), tg = f.i32(1, len);
      for (int p = 0; p < len; ++p) {
        tk.i32()[p] = tokens.i32()[b * S + p];
        tg.i32()[p] = targets.i32()[b * S + p];
      }
      const double upto = f.loss(tk, tg, Tensor()).sum;
      position_loss[static_cast<size_t>(b * S + len - 1)] = upto - before;
      before = upto;
    }
  }
  double want_all = 0, want_kept = 0;
  for (int i = 0; i < B * S; ++i) {
    want_all += position_loss[static_cast<size_t>(i)];
    if (mask.f32()[i] == 1.f) want_kept += position_loss[static_cast<size_t>(i)];
  }

  const LossSum none = f.loss(tokens, targets, Tensor());
  const LossSum all = f.loss(tokens, targets, ones);
  const LossSum masked = f.loss(tokens, ignored, mask);
  EXPECT_EQ(none.count, B * S);
  EXPECT_EQ(all.count, B * S);
  EXPECT_EQ(masked.count, kept);
  EXPECT_EQ(all.sum, none.sum);  // w · x = x for w = 1: no mask and an all-ones mask agree
  // The prefix runs compute in float with other GEMM and attention shapes: each position's loss
  // (≈ log 64 ≈ 4.2) may move by a few float ulps (~1e-6), and each difference carries the
  // rounding of two prefix sums. Measured: 1e-6 absolute on sums of ≈ 200 and ≈ 120 (5e-9
  // relative); 1e-6 relative leaves two orders of margin, while dropping or adding one position
  // moves the sum by ≈ 4.
  EXPECT_NEAR(none.sum, want_all, 1e-6 * want_all);
  EXPECT_NEAR(masked.sum, want_kept, 1e-6 * want_kept);
  // A masked position's target is never read: −100 and a real token give the same loss.
  EXPECT_EQ(f.loss(tokens, targets, mask).sum, masked.sum);
}

TEST(LossMask, GradientOfTheMaskedLossSum) {
  Fixture f;
  const int B = 2, S = 16, V = f.cfg.vocab_size;
  Tensor tokens = f.i32(B, S), targets = f.i32(B, S), ignored = f.i32(B, S);
  Tensor mask = f.be->empty({B, S}, MemCategory::kActivations);
  Tensor ones = f.be->empty({B, S}, MemCategory::kActivations);
  for (int i = 0; i < B * S; ++i) {
    tokens.i32()[i] = static_cast<int32_t>(mix64(900 + static_cast<uint64_t>(i)) % V);
    targets.i32()[i] = static_cast<int32_t>(mix64(950 + static_cast<uint64_t>(i)) % V);
    const bool keep = i % 4 != 1;
    mask.f32()[i] = keep ? 1.f : 0.f;
    ones.f32()[i] = 1.f;
    ignored.i32()[i] = keep ? targets.i32()[i] : kIgnoreIndex;
  }
  LossSum l_none, l_ones, l_masked, l_real_targets;
  const std::vector<float> g_none = f.grads(tokens, targets, Tensor(), &l_none);
  const std::vector<float> g_ones = f.grads(tokens, targets, ones, &l_ones);
  const std::vector<float> g = f.grads(tokens, ignored, mask, &l_masked);
  const std::vector<float> g_real_targets = f.grads(tokens, targets, mask, &l_real_targets);
  EXPECT_EQ(g_ones, g_none);     // an all-ones mask is no mask, bit for bit
  EXPECT_EQ(g_real_targets, g);  // masked rows' targets are never read
  EXPECT_NE(g, g_none);

  // d(masked loss sum)/d(w) by central differences, for two parameter elements: the one with the
  // largest gradient and the one whose gradient the mask changes most.
  size_t largest = 0, most_masked = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::fabs(g[i]) > std::fabs(g[largest])) largest = i;
    if (std::fabs(g[i] - g_none[i]) > std::fabs(g[most_masked] - g_none[most_masked]))
      most_masked = i;
  }
  // Tolerance 1e-3 relative. The loss sum (24 positions, ≈ 100) is float arithmetic whose
  // rounding moves it by ~1e-6 absolute, ~2e-4 absolute in the quotient over 2h = 6e-3; the
  // truncation error h²·L'''/6 dominates (measured: 9e-4 relative at h = 1e-2, ≤ 1e-4 at
  // h = 3e-3). Both gradients are ≥ 1 and the unmasked gradient of the second element differs by
  // far more than the tolerance (asserted), so a backward that ignored the mask fails.
  const float h = 3e-3f;
  for (size_t at : {largest, most_masked}) {
    float* w = f.model->params().params().f32() + at;
    const float w0 = *w, up = w0 + h, down = w0 - h;  // the steps as float holds them
    auto loss_at = [&](float v) {
      *w = v;
      f.model->params().params_changed();
      return f.loss(tokens, ignored, mask).sum;
    };
    const double plus = loss_at(up), minus = loss_at(down);
    loss_at(w0);
    const double numeric = (plus - minus) / (static_cast<double>(up) - static_cast<double>(down));
    const double tol = 1e-3 * std::fabs(numeric);
    ASSERT_GT(std::fabs(g[at]), 1.0f) << "parameter element " << at;
    EXPECT_NEAR(g[at], numeric, tol) << "parameter element " << at;
    if (at == most_masked) {
      ASSERT_GT(std::fabs(g_none[at] - numeric), 10 * tol) << "the check would not tell the mask";
    }
  }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A fused weight of unequal row blocks (Llama's q/k/v: NH·HS query rows, KVH·HS key and value
// rows) split over t ranks: rank r holds its share of every block, in block order; global_index
// finds each element's full row, every element is held exactly once, and the checkpoint spelling
// round-trips (and reads the older "qkv_rows" as three equal blocks).
TEST(ParamSplit, BlockRowsOfUnequalSizes) {
  const int64_t cols = 3;
  const std::vector<int64_t> blocks = {8, 4, 4};  // q: 4 heads × 2, k and v: 2 heads × 2
  for (int t : {1, 2, 4}) {
    std::vector<int> seen(static_cast<size_t>(16 * cols), 0);
    for (int r = 0; r < t; ++r) {
      ParamLayout layout(t, r);
      const ParamRef w = layout.add({"qkv.weight",
                                     {16, cols},
                                     ParamSplit::kBlockRows,
                                     ParamInit::kZeros,
                                     0,
                                     -1,
                                     true,
                                     blocks});
      const ParamInfo& p = layout.info(w);
      ASSERT_EQ(p.shape[0], 16 / t);
      for (int64_t i = 0; i < p.numel; ++i) {
        const int64_t g = global_index(p, i, r, t);
        ASSERT_GE(g, 0);
        ASSERT_LT(g, 16 * cols);
        ++seen[static_cast<size_t>(g)];
        // Local row i / cols: which block, and the row inside this rank's share of it.
        int64_t row = i / cols, start = 0;
        size_t b = 0;
        while (row >= blocks[b] / t) {
          row -= blocks[b] / t;
          start += blocks[b];
          ++b;
        }
        EXPECT_EQ(g / cols, start + r * (blocks[b] / t) + row) << "t " << t << " rank " << r;
        EXPECT_EQ(g % cols, i % cols);
      }
    }
    for (int n : seen) EXPECT_EQ(n, 1) << "t " << t;
  }
  ParamSplit split;
  std::vector<int64_t> parsed;
  const std::string spelled = split_spelling(ParamSplit::kBlockRows, blocks);
  EXPECT_EQ(spelled, "block_rows:8,4,4");
  ASSERT_TRUE(parse_param_split(spelled, 16, &split, &parsed));
  EXPECT_EQ(split, ParamSplit::kBlockRows);
  EXPECT_EQ(parsed, blocks);
  ASSERT_TRUE(parse_param_split("qkv_rows", 12, &split, &parsed));
  EXPECT_EQ(parsed, (std::vector<int64_t>{4, 4, 4}));
  EXPECT_FALSE(parse_param_split("block_rows:8,4", 16, &split, &parsed));  // sums to 12
  EXPECT_FALSE(parse_param_split("block_rows:8,x,4", 16, &split, &parsed));
  EXPECT_FALSE(parse_param_split("diagonal", 16, &split, &parsed));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Rotary frequencies against Hugging Face's (transformers 5.24, modeling_rope_utils: "llama3" for
// Llama 3.1 8B's rope_scaling, head size 128, theta 5e5), which it computes in float32: 1e-6
// relative. Indices 29–34 lie in the smoothed band (wavelengths between 8192/4 and 8192), 35 on
// are slowed by the factor 8, up to 28 kept; without scaling, theta^(−2i/HS) itself.
TEST(RotaryEmbedding, FrequenciesMatchHuggingFacesLlama3Scaling) {
  RopeScaling s;  // Llama 3.1's: factor 8, low 1, high 4, original 8192
  const std::vector<double> inv = rope_inverse_frequencies(128, 500000.0, s);
  ASSERT_EQ(inv.size(), 64u);
  const std::vector<std::pair<int, double>> hf = {
      {0, 1.000000000e+00},  {10, 1.286873817e-01}, {20, 1.656044088e-02}, {28, 3.211446106e-03},
      {29, 2.166570630e-03}, {30, 1.371893683e-03}, {33, 3.126936499e-04}, {34, 1.785077911e-04},
      {35, 9.556212171e-05}, {40, 3.428102355e-05}, {50, 4.411534519e-06}, {63, 3.068925878e-07}};
  for (const auto& [i, want] : hf)
    EXPECT_NEAR(inv[static_cast<size_t>(i)], want, 1e-6 * want) << "index " << i;
  const std::vector<double> plain = rope_inverse_frequencies(128, 500000.0, std::nullopt);
  for (int i = 0; i < 64; ++i)
    EXPECT_DOUBLE_EQ(plain[static_cast<size_t>(i)], 1.0 / std::pow(500000.0, 2.0 * i / 128));
}

// local_index inverts global_index for every split: each element of the full parameter is
// found on exactly the rank whose shard holds it, at the local index that maps back to it, and
// every other rank answers -1 (checkpoint loads read only what a rank holds through it).
TEST(ParamSplit, LocalIndexInvertsGlobalIndex) {
  struct Case {
    ParamSplit split;
    Shape shape;
    std::vector<int64_t> blocks;
  };
  const std::vector<Case> cases = {{ParamSplit::kReplicated, {12}, {}},
                                   {ParamSplit::kRows, {8, 3}, {}},
                                   {ParamSplit::kRows, {12}, {}},
                                   {ParamSplit::kCols, {3, 8}, {}},
                                   {ParamSplit::kBlockRows, {16, 3}, {8, 4, 4}}};
  for (const Case& c : cases)
    for (int t : {1, 2, 4}) {
      int64_t full = 1;
      for (int64_t d : c.shape) full *= d;
      std::vector<int> holders(static_cast<size_t>(full), 0);
      for (int r = 0; r < t; ++r) {
        ParamLayout layout(t, r);
        const ParamRef w =
            layout.add({"w", c.shape, c.split, ParamInit::kZeros, 0, -1, true, c.blocks});
        const ParamInfo& p = layout.info(w);
        for (int64_t g = 0; g < full; ++g) {
          const int64_t l = local_index(p, g, r, t);
          if (l < 0) continue;
          ASSERT_LT(l, p.numel);
          EXPECT_EQ(global_index(p, l, r, t), g) << split_spelling(c.split, c.blocks);
          ++holders[static_cast<size_t>(g)];
        }
        EXPECT_EQ(local_index(p, full + 5, r, t), -1);
        EXPECT_EQ(local_index(p, -1, r, t), -1);
      }
      const int want = c.split == ParamSplit::kReplicated ? t : 1;
      for (int n : holders) EXPECT_EQ(n, want) << split_spelling(c.split, c.blocks) << " t " << t;
    }
}

}  // namespace
// An expert-split parameter (a mixture's experts under expert parallelism): the rows are cut into
// e runs of whole experts first, then each run split over the tensor group as its ParamSplit
// says. Over every (expert rank, tensor rank), each element of the full parameter is held exactly
// once, global_index and local_index agree, and expert rank j's elements lie in rows [j·R/e,
// (j+1)·R/e) — for the experts' [gate; up] blocks (block_rows) and their down projection (cols).
TEST(ParamSplit, ExpertRunsThenTensorShards) {
  struct Case {
    ParamSplit split;
    Shape shape;
    std::vector<int64_t> blocks;
  };
  const int64_t E = 4, F = 4, C = 6;
  const std::vector<Case> cases = {
      {ParamSplit::kBlockRows, {E * 2 * F, C}, std::vector<int64_t>(2 * E, F)},
      {ParamSplit::kCols, {E * C, F}, {}},
      {ParamSplit::kRows, {E * F, C}, {}},
      {ParamSplit::kReplicated, {E * F, C}, {}}};
  for (const Case& c : cases)
    for (int e : {1, 2, 4})
      for (int t : {1, 2}) {
        const int64_t full = c.shape[0] * c.shape[1], row = c.shape[1];
        std::vector<int> holders(static_cast<size_t>(full), 0);
        for (int j = 0; j < e; ++j)
          for (int r = 0; r < t; ++r) {
            ParamLayout layout(t, r, e, j);
            const ParamRef w =
                layout.add({"w", c.shape, c.split, ParamInit::kZeros, 0, -1, true, c.blocks, true});
            const ParamInfo& p = layout.info(w);
            EXPECT_EQ(p.expert, e);
            EXPECT_EQ(p.expert_rank, j);
            const int copies = c.split == ParamSplit::kReplicated ? t : 1;
            EXPECT_EQ(p.numel * e * t / copies, full) << split_spelling(c.split, c.blocks);
            for (int64_t l = 0; l < p.numel; ++l) {
              const int64_t g = global_index(p, l, r, t);
              ASSERT_GE(g, 0);
              ASSERT_LT(g, full);
              EXPECT_GE(g / row, j * c.shape[0] / e);
              EXPECT_LT(g / row, (j + 1) * c.shape[0] / e);
              EXPECT_EQ(local_index(p, g, r, t), l) << split_spelling(c.split, c.blocks);
              if (r == 0 || c.split != ParamSplit::kReplicated) ++holders[static_cast<size_t>(g)];
            }
            // Another expert run's first element is not this rank's.
            const int64_t other = ((j + 1) % e) * (c.shape[0] / e) * row;
            if (e > 1) {
              EXPECT_EQ(local_index(p, other, r, t), -1);
            }
          }
        for (int n : holders)
          EXPECT_EQ(n, 1) << split_spelling(c.split, c.blocks) << " e " << e << " t " << t;
      }
}

}  // namespace strata
