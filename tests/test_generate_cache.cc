// Generation's key/value cache against the training forward (an independent path: the full
// causal attention of attention_forward over the whole sequence, not the cache's
// attention_decode): every token greedy generation picks is the argmax of the training forward's
// logits at its position on the prompt plus the tokens before it (teacher forcing), for GPT and
// Llama (grouped-query attention, rotary embeddings from each position), in one batch of equal
// prompts, and whether the prompt is prefilled at once or token by token.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "launch/config/config_parse.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "runtime/backend.h"

namespace strata {
namespace {

class GenerateCache : public ::testing::TestWithParam<const char*> {};

// The argmax over the real vocabulary of row r of the training forward's logits.
int argmax_row(const Tensor& logits, int64_t r, int V) {
  const float* row = logits.f32() + r * logits.size(1);
  return static_cast<int>(std::max_element(row, row + V) - row);
}

TEST_P(GenerateCache, GreedyTokensAreTheTrainingForwardsArgmax) {
  const ModelConfig m =
      load_config("", {std::string("model.preset=") + GetParam(), "model.init_std=0.3"}).model;
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ModelOptions o;
  o.seed = 5;
  std::unique_ptr<Model> model = build_model(m, o, *be);
  const int V = m.vocab_size, B = 2, P = 5, N = 20;
  const std::vector<int32_t> prompts = {3, 14, 15, 9, 2, 7, 1, 8, 28, 18};  // two prompts of 5
  // Generation: the prompts prefilled at once, then one token per step over the cache.
  std::unique_ptr<GenerationState> st = model->start_generation(B, P + N);
  std::vector<int32_t> step = prompts;
  std::vector<std::vector<int32_t>> gen(B);
  int T = P;
  for (int n = 0; n < N; ++n) {
    const std::vector<float> logits = model->decode(*st, step, T);
    step.assign(B, 0);
    for (int b = 0; b < B; ++b) {
      const float* row = logits.data() + b * V;
      step[b] = static_cast<int32_t>(std::max_element(row, row + V) - row);
      gen[b].push_back(step[b]);
    }
    T = 1;
  }
  // Generation is not degenerate (the check below would be weak on a constant sequence).
  for (int b = 0; b < B; ++b)
    EXPECT_GT(std::set<int32_t>(gen[b].begin(), gen[b].end()).size(), 2u) << GetParam();
  // The training forward on prompt + generated tokens: position P − 1 + n predicts token n.
  const int S = P + N - 1;
  Tensor tokens = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  Tensor targets = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  std::vector<int32_t> seq(B * S), tg(B * S, 0);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      seq[b * S + i] = i < P ? prompts[b * P + i] : gen[b][static_cast<size_t>(i - P)];
  be->upload(tokens, seq.data());
  be->upload(targets, tg.data());
  LossSum loss;
  PieceActsPtr acts = model->forward(ModelBatch{tokens, targets, Tensor()}, &loss);
  const Tensor& logits = DecoderModel::logits(*acts);  // (B·S, Vp)
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < N; ++n)
      EXPECT_EQ(argmax_row(logits, b * S + P - 1 + n, V), gen[b][n])
          << GetParam() << " sequence " << b << " token " << n;
  // Token-by-token prefill gives the same first token as the prefill at once.
  std::unique_ptr<GenerationState> one = model->start_generation(1, P + 1);
  std::vector<float> last;
  for (int i = 0; i < P; ++i) last = model->decode(*one, {prompts[i]}, 1);
  EXPECT_EQ(static_cast<int>(std::max_element(last.begin(), last.begin() + V) - last.begin()),
            gen[0][0]);
}

INSTANTIATE_TEST_SUITE_P(Models, GenerateCache, ::testing::Values("tiny", "llama-tiny"));

}  // namespace
}  // namespace strata
