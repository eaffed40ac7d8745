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
#include "launch/train/trainer.h"
#include "models/registry.h"
#include "models/transformer/lm_head.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"

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
  const Tensor& logits = lm_logits(*acts);  // (B·S, Vp)
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

// log.sample_interval: samples during training leave the run as it was — its losses, gradient
// norms and final parameters bit for bit — and come every interval with sample_tokens tokens.
TEST(TrainingSamples, LeaveTheRunBitIdentical) {
  std::vector<std::string> sets = {"model.preset=llama-tiny",  "train.iterations=6",
                                   "train.micro_batch_size=2", "train.global_batch_size=4",
                                   "train.eval_interval=3",    "train.threads=1",
                                   "log.interval=1000"};
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = true;
  const TrainResult plain = run_training(load_config("", sets), ctx);
  sets.push_back("log.sample_interval=2");
  sets.push_back("log.sample_tokens=7");
  sets.push_back("log.sample_prompt=3,1,4");
  const TrainResult sampled = run_training(load_config("", sets), ctx);
  EXPECT_EQ(sampled.losses, plain.losses);
  EXPECT_EQ(sampled.grad_norms, plain.grad_norms);
  EXPECT_EQ(sampled.val_losses, plain.val_losses);
  EXPECT_EQ(sampled.final_params, plain.final_params);
  ASSERT_EQ(sampled.samples.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(sampled.samples[k].first, 2 * static_cast<int>(k + 1));
    EXPECT_EQ(sampled.samples[k].second.size(), 7u);
  }
  EXPECT_TRUE(plain.samples.empty());
}

// Greedy tokens of a model holding `params` (a run's final_params), over the cache.
std::vector<int32_t> greedy(const ModelConfig& m, const std::vector<float>& params,
                            std::vector<int32_t> step, int n) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  std::unique_ptr<Model> model = build_model(m, ModelOptions(), *be);
  be->upload(model->params().params(), params.data());
  model->params().params_changed();
  std::unique_ptr<GenerationState> st =
      model->start_generation(1, static_cast<int64_t>(step.size()) + n);
  std::vector<int32_t> ids;
  for (int k = 0; k < n; ++k) {
    const std::vector<float> logits = model->decode(*st, step, static_cast<int>(step.size()));
    step = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    ids.push_back(step[0]);
  }
  return ids;
}

// PipeDream-2BW reports its steps when its one instruction list has run: a sample of step N
// must come from W(N), the weights that step wrote, not from the newest — the same tokens as a
// decode of the final weights of the run stopped at N (same learning-rate schedule).
TEST(TrainingSamples, TwoBWSamplesTheWeightsOfTheirStep) {
  std::vector<std::string> sets = {"model.preset=llama-tiny",   "parallel.schedule=2bw",
                                   "optimizer.lr=1e-2",         "optimizer.decay_iters=6",
                                   "optimizer.warmup_iters=1",  "train.micro_batch_size=2",
                                   "train.global_batch_size=4", "train.eval_interval=0",
                                   "train.threads=1",           "log.interval=1000"};
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = true;
  std::vector<std::string> three = sets;
  three.push_back("train.iterations=3");
  const Config cfg3 = load_config("", three);
  const TrainResult stopped = run_training(cfg3, ctx);
  sets.push_back("train.iterations=6");
  sets.push_back("log.sample_interval=3");
  sets.push_back("log.sample_tokens=12");
  sets.push_back("log.sample_prompt=3,1,4");
  const TrainResult sampled = run_training(load_config("", sets), ctx);
  ASSERT_EQ(sampled.samples.size(), 2u);
  EXPECT_EQ(sampled.samples[0].second, greedy(cfg3.model, stopped.final_params, {3, 1, 4}, 12));
  EXPECT_NE(sampled.samples[0].second, sampled.samples[1].second) << "W(3) and W(6) agree";
}

}  // namespace
}  // namespace strata
