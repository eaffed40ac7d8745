// End-to-end training in one process: convergence to outside references (the synthetic chain's
// exact loss floor; a stated validation loss on real text), determinism, gradient accumulation
// giving the same losses as one large micro-batch, and the memory prediction against the
// allocator's measured peak.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "eval_reference.h"
#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "models/gpt/gpt.h"

namespace strata {
namespace {

Config tiny(std::vector<std::string> sets) {
  std::vector<std::string> base = {"model.preset=tiny", "train.threads=1", "train.eval_interval=0",
                                   "log.interval=100000"};
  base.insert(base.end(), sets.begin(), sets.end());
  return load_config("", base);
}

RunContext quiet() {
  RunContext c;
  c.verbose = false;
  return c;
}

// A first-order chain over 32 tokens: the tiny model must reach the exact entropy rate within
// 0.05 nats in 300 steps (measured: +0.034 nats; single-threaded, so deterministic here).
TEST(Train, SyntheticChainReachesItsEntropyFloor) {
  const Config c =
      tiny({"data.synthetic.order=1", "data.synthetic.vocab_size=32", "train.micro_batch_size=8",
            "train.global_batch_size=32", "train.iterations=300", "optimizer.lr=3e-3",
            "optimizer.min_lr=3e-4", "optimizer.warmup_iters=20", "train.eval_interval=300",
            "train.eval_iters=8"});
  const TrainResult r = run_training(c, quiet());
  ASSERT_TRUE(r.loss_floor.has_value());
  ASSERT_EQ(r.val_losses.size(), 1u);
  const double val = r.val_losses.back().second;
  std::printf("synthetic chain: validation loss %.4f, floor %.4f (+%.4f nats)\n", val,
              *r.loss_floor, val - *r.loss_floor);
  EXPECT_GT(val, *r.loss_floor - 0.01) << "below the information-theoretic floor: a leak";
  EXPECT_LT(val, *r.loss_floor + 0.05) << "floor " << *r.loss_floor;
  EXPECT_LT(r.losses.back(), r.losses.front() - 1.0);
}

TEST(Train, SameSeedSameLossesBitForBit) {
  const Config c =
      tiny({"train.iterations=5", "train.micro_batch_size=2", "train.global_batch_size=4"});
  const TrainResult a = run_training(c, quiet());
  const TrainResult b = run_training(c, quiet());
  ASSERT_EQ(a.losses.size(), 5u);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << i;
  EXPECT_EQ(a.final_params, b.final_params);
}

// The loss is the mean over the global batch however it is split into micro-batches, and the
// data order does not depend on the micro-batch size (docs/contracts.md's numerical rules).
TEST(Train, GradientAccumulationMatchesOneLargeMicroBatch) {
  const auto run = [](int micro) {
    return run_training(tiny({"train.iterations=10", "train.global_batch_size=8",
                              "train.micro_batch_size=" + std::to_string(micro)}),
                        quiet());
  };
  const TrainResult big = run(8), small = run(2), single = run(1);
  for (size_t i = 0; i < big.losses.size(); ++i) {
    EXPECT_NEAR(small.losses[i], big.losses[i], 1e-5 * big.losses[i]) << "iteration " << i;
    EXPECT_NEAR(single.losses[i], big.losses[i], 1e-5 * big.losses[i]) << "iteration " << i;
    EXPECT_NEAR(small.grad_norms[i], big.grad_norms[i], 1e-4 * big.grad_norms[i]) << i;
  }
}

TEST(Train, ThreadCountDoesNotChangeTheResult) {
  const TrainResult one = run_training(tiny({"train.iterations=5"}), quiet());
  const TrainResult two = run_training(tiny({"train.iterations=5", "train.threads=2"}), quiet());
  for (size_t i = 0; i < one.losses.size(); ++i)
    EXPECT_NEAR(two.losses[i], one.losses[i], 1e-5 * one.losses[i]) << i;
}

// The dry-run prediction (the planner's memory model) against what the allocator measured, per
// category and in total.
TEST(Train, MemoryPredictionMatchesMeasuredPeak) {
  for (const char* sets : {"train.micro_batch_size=4", "train.micro_batch_size=16"}) {
    const Config c = tiny({"train.iterations=2", sets, "train.global_batch_size=16"});
    const TrainResult r = run_training(c, quiet());
    const nlohmann::json p =
        planner_prediction(c, 1).at("predicted").at("memory_bytes_per_stage")[0];
    EXPECT_EQ(r.memory.peak_of(MemCategory::kParameters), p.at("parameters").get<double>());
    EXPECT_EQ(r.memory.peak_of(MemCategory::kGradients), p.at("gradients").get<double>());
    EXPECT_EQ(r.memory.peak_of(MemCategory::kOptimizer), p.at("optimizer").get<double>());
    const double measured = static_cast<double>(r.memory.total_peak);
    EXPECT_NEAR(p.at("total").get<double>(), measured, 0.10 * measured) << sets;
  }
}

// Clipping reaches the update (the coefficient c = clip/(norm + 1e-6) is applied inside AdamW, to
// each gradient as it is read). With Adam's eps far above every gradient, a first step moves a
// weight by lr·g·c/(|g·c| + eps) ≈ lr·g·c/eps: linear in c, so the clipped run's changes are c
// times the unclipped run's (a coefficient applied twice, squared or not at all would not be).
// No weight decay, so nothing else moves the weights.
TEST(Train, ClippingScalesTheUpdates) {
  auto run = [](const std::string& lr, const std::string& clip) {
    return run_training(
        tiny({"train.iterations=1", "optimizer.warmup_iters=0", "optimizer.decay=constant",
              "optimizer.weight_decay=0", "optimizer.eps=1e4", "optimizer.lr=" + lr,
              "optimizer.min_lr=" + lr, "optimizer.grad_clip=" + clip}),
        quiet());
  };
  const TrainResult frozen = run("0", "0"), free = run("100", "0");
  const double norm = free.grad_norms.at(0), clip = norm / 4;
  char clip_text[32];
  std::snprintf(clip_text, sizeof clip_text, "%.17g", clip);
  const TrainResult clipped = run("100", clip_text);
  const double c = clip / (norm + 1e-6);
  ASSERT_EQ(clipped.grad_norms.at(0), norm);  // the norm is reported before clipping
  double largest = 0;
  for (size_t i = 0; i < free.final_params.size(); ++i)
    largest = std::max(largest, std::fabs(double(free.final_params[i]) - frozen.final_params[i]));
  ASSERT_GT(largest, 1e-6);
  int checked = 0, bad = 0;
  double worst = 0;
  for (size_t i = 0; i < free.final_params.size(); ++i) {
    const double d_free = double(free.final_params[i]) - frozen.final_params[i];
    if (std::fabs(d_free) < 0.5 * largest) continue;  // small changes are mostly rounding
    const double ratio = (double(clipped.final_params[i]) - frozen.final_params[i]) / d_free;
    ++checked;
    worst = std::max(worst, std::fabs(ratio - c) / c);
    if (std::fabs(ratio - c) > 1e-3 * c && bad++ < 3)
      ADD_FAILURE() << "param " << i << ": clipped change / unclipped change = " << ratio
                    << ", want c = " << c;
  }
  std::printf(
      "clipping coefficient %.4f: %d weights checked, largest unclipped change %.3g, "
      "ratio off by at most %.2g relative\n",
      c, checked, largest, worst);
  EXPECT_EQ(bad, 0);
}

TEST(Train, NonFiniteStepsAreSkippedThenTheRunStops) {
  // A learning rate of 1e30 blows the weights up after the first step: later losses are not
  // finite, steps are skipped and reported, and the fifth in a row ends the run.
  const Config c = tiny({"train.iterations=20", "optimizer.lr=1e30", "optimizer.warmup_iters=0",
                         "optimizer.grad_clip=0", "optimizer.min_lr=0"});
  try {
    run_training(c, quiet());
    FAIL() << "a diverging run must stop";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("5 non-finite steps in a row"), std::string::npos)
        << e.what();
  }
}

// A diverging run saves no checkpoint whose weights hold a NaN or an infinity (before, the
// checkpoints of the iterations between the blow-up and the fifth non-finite step were written,
// and a resume from the newest one trained NaN): the run resumed from its newest checkpoint
// trains finite losses again. A learning rate of 1e39 (above float's range) makes the weights
// infinite at the first step.
TEST(Train, DivergingRunSavesNoNonFiniteCheckpoint) {
  const std::string dir = ::testing::TempDir() + "strata_diverge_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::vector<std::string> ck = {"checkpoint.dir=" + dir, "checkpoint.interval=1",
                                       "checkpoint.keep=100", "train.iterations=20"};
  std::vector<std::string> diverge = {"optimizer.lr=1e39", "optimizer.warmup_iters=0",
                                      "optimizer.grad_clip=0", "optimizer.min_lr=0"};
  diverge.insert(diverge.end(), ck.begin(), ck.end());
  EXPECT_THROW(run_training(tiny(diverge), quiet()), std::runtime_error);
  std::vector<std::string> resume = ck;
  resume.push_back("checkpoint.resume=auto");
  resume.push_back("optimizer.lr=1e-3");
  const TrainResult r = run_training(tiny(resume), quiet());
  ASSERT_FALSE(r.losses.empty());
  for (double l : r.losses)
    EXPECT_TRUE(std::isfinite(l)) << "resumed from iteration " << r.start_iteration;
  std::filesystem::remove_all(dir);
}

// log.trace is written as the run goes: a run that ends in an error keeps the events of the
// steps before it in the file, an unterminated JSON array as Chrome's trace format allows (before,
// every event stayed in memory until the end and the whole trace was lost).
TEST(Train, TraceIsWrittenAsTheRunGoes) {
  const std::string trace =
      ::testing::TempDir() + "strata_trace_" + std::to_string(::getpid()) + ".json";
  const Config c = tiny({"train.iterations=20", "optimizer.lr=1e39", "optimizer.warmup_iters=0",
                         "optimizer.grad_clip=0", "optimizer.min_lr=0", "log.trace=" + trace});
  EXPECT_THROW(run_training(c, quiet()), std::runtime_error);  // 5 non-finite steps in a row
  std::ifstream in(trace);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(text.rfind("{\"traceEvents\": [", 0), 0u) << text.substr(0, 100);
  const nlohmann::json j = nlohmann::json::parse(text + "\n]}");
  EXPECT_GE(j["traceEvents"].size(), 5u * 2) << "events of the steps before the error";
  std::filesystem::remove(trace);
}

// Activation recomputation trades compute for memory: the same losses, a lower activation peak
// (selective drops the S×S attention probabilities, full keeps only each block's input).
TEST(Train, RecomputeKeepsLossesAndLowersActivationPeak) {
  auto run = [](const char* mode) {
    return run_training(
        tiny({"train.iterations=3", "model.num_layers=4", std::string("train.recompute=") + mode}),
        quiet());
  };
  const TrainResult none = run("none"), selective = run("selective"), full = run("full");
  for (size_t i = 0; i < none.losses.size(); ++i) {
    EXPECT_NEAR(selective.losses[i], none.losses[i], 1e-6 * none.losses[i]);
    EXPECT_NEAR(full.losses[i], none.losses[i], 1e-6 * none.losses[i]);
  }
  const int64_t a = none.memory.peak_of(MemCategory::kActivations);
  const int64_t b = selective.memory.peak_of(MemCategory::kActivations);
  const int64_t c = full.memory.peak_of(MemCategory::kActivations);
  std::printf("activation peak: none %lld B, selective %lld B, full %lld B\n",
              static_cast<long long>(a), static_cast<long long>(b), static_cast<long long>(c));
  EXPECT_LT(b, a);
  EXPECT_LT(c, b);
}

// PipeDream-2BW's update rule in one process (docs/contracts.md): batch j runs on W(max(j−1, 0)),
// so batches 0 and 1 both see the initial weights — batch 1's loss is the loss a run that never
// updates (lr 0) sees for it — while W(1) is the usual first update, so the flushing run's
// first two losses bracket it.
TEST(Train, TwoBWUsesTheWeightsOfTwoBatchesAgo) {
  const std::vector<std::string> common = {"train.iterations=4", "optimizer.warmup_iters=0",
                                           "optimizer.decay=constant", "optimizer.lr=1e-2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> s = common;
    s.insert(s.end(), extra.begin(), extra.end());
    return run_training(tiny(s), quiet());
  };
  const TrainResult two_bw = with({"parallel.schedule=2bw"});
  const TrainResult frozen = with({"optimizer.lr=0", "optimizer.min_lr=0"});
  const TrainResult flush = with({});
  ASSERT_EQ(two_bw.losses.size(), 4u);
  EXPECT_EQ(two_bw.losses[0], flush.losses[0]);   // W(0) for both
  EXPECT_EQ(two_bw.losses[1], frozen.losses[1]);  // batch 1 on W(0)
  EXPECT_NE(two_bw.losses[1], flush.losses[1]);   // the flushing run uses W(1) there
  EXPECT_NE(two_bw.final_params, flush.final_params);
  // Two weight versions, never more.
  EXPECT_EQ(two_bw.memory.peak_of(MemCategory::kParameters),
            2 * flush.memory.peak_of(MemCategory::kParameters));
}

// 2bw evaluates the newest weights W(n) after n steps, whatever the number of steps and of
// validation batches: its val_loss equals a plain forward of its final parameters over the same
// batches (tests/eval_reference.h), and evaluating leaves the final parameters those of the run
// without evaluation. Odd n and several batches matter: evaluation once chose a version by the
// validation batch's index (max(k − 1, 0)), right only for k ≤ 1 at even n.
TEST(Train, TwoBWEvaluatesTheNewestWeights) {
  for (int iters : {14, 15}) {
    const std::vector<std::string> sets = {
        "parallel.schedule=2bw",    "train.iterations=" + std::to_string(iters),
        "train.micro_batch_size=2", "train.global_batch_size=4",
        "optimizer.warmup_iters=0", "optimizer.decay=constant",
        "optimizer.lr=1e-2",        "train.eval_iters=3"};
    std::vector<std::string> with_eval = sets;
    with_eval.push_back("train.eval_interval=" + std::to_string(iters));
    const Config c = tiny(with_eval);
    const TrainResult r = run_training(c, quiet());
    const TrainResult no_eval = run_training(tiny(sets), quiet());
    ASSERT_EQ(r.val_losses.size(), 1u);
    ASSERT_EQ(r.val_losses[0].first, iters);
    const double want = testref::plain_val_loss(c, r.final_params);
    std::printf("2bw, %d iterations: val_loss %.7f, plain forward of the final weights %.7f\n",
                iters, r.val_losses[0].second, want);
    EXPECT_NEAR(r.val_losses[0].second, want, 1e-6 * want) << iters << " iterations";
    EXPECT_EQ(r.final_params, no_eval.final_params) << iters << " iterations";
  }
}

// Byte-level tiny Shakespeare: the tiny model (2 layers, hidden 64) reaches a validation loss
// below 2.5 nats/byte in 400 steps (measured ~2.3; a unigram model sits at ~3.3 and uniform at
// ln 256 = 5.5), so it has learned real structure of English.
TEST(Train, TinyShakespeareValidationLoss) {
  const std::string path = std::string(STRATA_SHARED_DATA_DIR) + "/tinyshakespeare.txt";
  if (!std::ifstream(path))
    GTEST_SKIP() << "tinyshakespeare.txt not found in " << STRATA_SHARED_DATA_DIR;
  const Config c =
      tiny({"data.source=text", "data.path=" + path, "model.vocab_size=256",
            "train.micro_batch_size=16", "train.global_batch_size=16", "train.iterations=400",
            "optimizer.lr=3e-3", "optimizer.min_lr=3e-4", "optimizer.warmup_iters=20",
            "train.eval_interval=400", "train.eval_iters=8"});
  const TrainResult r = run_training(c, quiet());
  ASSERT_EQ(r.val_losses.size(), 1u);
  std::printf("tiny Shakespeare: validation loss %.4f nats/byte after 400 steps\n",
              r.val_losses.back().second);
  EXPECT_LT(r.val_losses.back().second, 2.5);
}

}  // namespace
}  // namespace strata
