// `strata generate` (launch/commands/generate.h) against Hugging Face transformers' greedy
// decoding: tests/golden/generate/greedy.json holds model.generate(do_sample=False) tokens of two
// random tiny models (hf_gpt2_tiny/, hf_llama_tiny/), written by
// tests/golden/generate/make_generate_fixtures.py (tests/golden/README.md). Greedy decoding must
// give the same tokens exactly: the script checked that the top-2 logit gap is > 1e-2 at every
// step, far above float32 rounding differences between the two implementations.
//
// A multi-rank binary (mpi_tests.cmake): mpi_generate_np1 runs it alone, mpi_generate_tp2 under
// mpirun -np 2 with STRATA_TEST_GENERATE_SETS=parallel.tensor=2, whose --set overrides (separated
// by spaces) every generate() call takes: the same fixture must hold with the model split over
// two tensor-parallel ranks. generate() is collective and every rank returns the same, so every
// rank checks its own result.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "launch/commands/generate.h"
#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "mpi_test_util.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

const std::string kDir = std::string(STRATA_TEST_DIR) + "/golden/generate";

struct Case {
  std::vector<int32_t> prompt;
  int max_new_tokens = 0;
  std::vector<int32_t> ids;
};

// The fixture of a Hugging Face model type ("gpt2", "llama").
std::string hf_dir(const std::string& model_type) {
  return kDir + "/hf_" + model_type + "_tiny";
}

std::vector<Case> cases(const std::string& arch) {
  static const nlohmann::json fixture = [] {
    std::ifstream f(kDir + "/greedy.json");
    EXPECT_TRUE(f.good()) << kDir << "/greedy.json";
    return nlohmann::json::parse(f);
  }();
  std::vector<Case> out;
  for (const nlohmann::json& c : fixture.at(arch)) {
    Case k;
    k.prompt = c.at("prompt").get<std::vector<int32_t>>();
    k.max_new_tokens = c.at("max_new_tokens").get<int>();
    k.ids = c.at("ids").get<std::vector<int32_t>>();
    out.push_back(k);
  }
  return out;
}

// STRATA_TEST_GENERATE_SETS: --set overrides separated by spaces ("parallel.tensor=2").
std::vector<std::string> env_sets() {
  std::vector<std::string> sets;
  if (const char* s = std::getenv("STRATA_TEST_GENERATE_SETS")) {
    std::istringstream in(s);
    for (std::string w; in >> w;) sets.push_back(w);
  }
  return sets;
}

GenerateOptions options(const std::string& arch, std::vector<std::vector<int32_t>> prompts,
                        int max_new_tokens) {
  GenerateOptions o;
  o.source.hf = hf_dir(arch);
  o.source.sets = env_sets();
  o.prompt_ids = std::move(prompts);
  o.max_new_tokens = max_new_tokens;
  return o;  // temperature 0: greedy
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

class GreedyMatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyMatchesTransformers, EachCaseAlone) {
  const std::string arch = GetParam();
  const std::vector<Case> cs = cases(arch);
  ASSERT_FALSE(cs.empty());
  for (const Case& c : cs) {
    SCOPED_TRACE(arch + ": prompt [" + show(c.prompt) + "], max_new_tokens " +
                 std::to_string(c.max_new_tokens));
    const std::vector<Generation> g = generate(options(arch, {c.prompt}, c.max_new_tokens));
    ASSERT_EQ(g.size(), 1u);
    EXPECT_EQ(g[0].prompt_ids, c.prompt);
    EXPECT_EQ(g[0].ids, c.ids) << "got [" << show(g[0].ids) << "], transformers [" << show(c.ids)
                               << "]";
  }
}

// Several prompts in one call: each gets its own generation, as if alone — prompts of different
// lengths (1, 5, 17 tokens at 8 and 40 new tokens) and four prompts of 5 tokens (20 new tokens),
// which generate runs as one batch over one key/value cache.
TEST_P(GreedyMatchesTransformers, Batched) {
  const std::string arch = GetParam();
  for (int n : {8, 40, 20}) {
    std::vector<Case> batch;
    for (const Case& c : cases(arch))
      if (c.max_new_tokens == n) batch.push_back(c);
    ASSERT_GE(batch.size(), 2u) << "the fixture has no prompts with max_new_tokens " << n;
    std::vector<std::vector<int32_t>> prompts;
    for (const Case& c : batch) prompts.push_back(c.prompt);
    const std::vector<Generation> g = generate(options(arch, prompts, n));
    ASSERT_EQ(g.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      SCOPED_TRACE(arch + ": batch of " + std::to_string(batch.size()) + ", max_new_tokens " +
                   std::to_string(n) + ", prompt " + std::to_string(i));
      EXPECT_EQ(g[i].prompt_ids, batch[i].prompt);
      EXPECT_EQ(g[i].ids, batch[i].ids)
          << "got [" << show(g[i].ids) << "], transformers [" << show(batch[i].ids) << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixture, GreedyMatchesTransformers,
                         ::testing::Values(std::string("gpt2"), std::string("llama")));

TEST(GenerateInput, EmptyPromptIsRefused) {
  EXPECT_THROW(generate(options("gpt2", {{}}, 4)), InputError);
  EXPECT_THROW(generate(options("llama", {{1, 2}, {}}, 4)), InputError);
}

TEST(GenerateInput, TokenOutsideTheVocabularyIsRefused) {
  // vocab_size 97 (the padded vocabulary's extra rows are not tokens).
  EXPECT_THROW(generate(options("gpt2", {{1, 97}}, 4)), InputError);
  EXPECT_THROW(generate(options("llama", {{96, 200}}, 4)), InputError);
  EXPECT_THROW(generate(options("gpt2", {{-1}}, 4)), InputError);
}

TEST(GenerateInput, TopPOutsideZeroToOneIsRefused) {
  for (double p : {0.0, -0.5, 1.5}) {
    SCOPED_TRACE("top_p " + std::to_string(p));
    GenerateOptions o = options("gpt2", {{1, 2, 3}}, 4);
    o.temperature = 1;
    o.top_p = p;
    EXPECT_THROW(generate(o), InputError);
  }
}

// A tiny temperature is greedy: 2.3e-308 (logits ÷ T overflowed to ±inf before, and their NaN
// differences sampled the least likely tokens) and 1e-9 give the greedy tokens exactly.
TEST(GenerateInput, TinyTemperatureIsGreedy) {
  const GenerateOptions greedy = options("gpt2", {{1, 2, 3}}, 6);
  const std::vector<int32_t> want = generate(greedy)[0].ids;
  for (double t : {2.3e-308, 1e-9}) {
    SCOPED_TRACE("temperature " + std::to_string(t));
    GenerateOptions o = greedy;
    o.temperature = t;
    EXPECT_EQ(generate(o)[0].ids, want);
  }
}

// log.sample_interval at every layout (issue 26): each layout's samples are the single-process
// run's tokens, and its losses, gradient norms and final parameters are those of the same layout
// without samples, bit for bit. Pipelines decode piece after piece (interleaved too), 2bw from
// the weights it kept of each sampled step, sequence parallelism without splitting the sequence.
struct SampleLayout {
  std::string name;
  int world;
  std::vector<std::string> sets;
};

TrainResult train(const std::vector<std::string>& layout, bool samples, bool solo) {
  std::vector<std::string> sets = {"model.preset=llama-tiny",  "model.num_layers=4",
                                   "model.seq_len=32",         "train.iterations=6",
                                   "train.micro_batch_size=1", "train.global_batch_size=4",
                                   "train.eval_interval=3",    "train.threads=1",
                                   "optimizer.lr=3e-3",        "log.interval=100000"};
  sets.insert(sets.end(), layout.begin(), layout.end());
  if (samples)
    for (const char* s :
         {"log.sample_interval=3", "log.sample_tokens=9", "log.sample_prompt=5,1,4"})
      sets.push_back(s);
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = solo;
  return run_training(load_config("", sets), ctx);
}

TEST(TrainingSamples, EveryLayoutSamplesTheSingleProcessTokens) {
  const std::vector<SampleLayout> layouts = {
      {"pipeline 2, 1f1b", 2, {"parallel.pipeline=2"}},
      {"pipeline 2, interleaved",
       2,
       {"parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.schedule=interleaved"}},
      {"pipeline 2, zb-h1", 2, {"parallel.pipeline=2", "parallel.schedule=zb-h1"}},
      {"tensor 2, sequence parallel", 2, {"parallel.tensor=2", "parallel.sequence_parallel=true"}},
      {"data 2, ZeRO-1", 2, {"parallel.distributed_optimizer=true"}},
      {"tensor 2 sp, pipeline 2",
       4,
       {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.pipeline=2"}},
      {"pipeline 4, 1f1b",
       4,
       {"parallel.pipeline=4", "parallel.virtual_stages=1", "parallel.schedule=1f1b"}},
  };
  const std::vector<SampleLayout> two_bw = {
      {"2bw, pipeline 2", 2, {"parallel.schedule=2bw", "parallel.pipeline=2"}},
      {"2bw, tensor 2, pipeline 2",
       4,
       {"parallel.schedule=2bw", "parallel.pipeline=2", "parallel.tensor=2"}},
  };
  if (world().size != 2 && world().size != 4) GTEST_SKIP() << "runs on 2 or 4 ranks";
  // The references: the flushing schedules' single-process run, and the single-process 2bw.
  const TrainResult ref = train({}, true, true);
  const TrainResult ref_2bw = train({"parallel.schedule=2bw"}, true, true);
  ASSERT_EQ(ref.samples.size(), 2u);
  ASSERT_EQ(ref_2bw.samples.size(), 2u);
  EXPECT_NE(ref.samples, ref_2bw.samples) << "2bw trains other weights: its samples differ";
  auto check = [&](const SampleLayout& l, const TrainResult& want) {
    if (l.world != world().size) return;
    SCOPED_TRACE(l.name);
    const TrainResult plain = train(l.sets, false, false);
    const TrainResult sampled = train(l.sets, true, false);
    mpitest::Tally tally;
    tally.add(l.name + ": losses", sampled.losses != plain.losses);
    tally.add(l.name + ": grad norms", sampled.grad_norms != plain.grad_norms);
    tally.add(l.name + ": val losses", sampled.val_losses != plain.val_losses);
    tally.add(l.name + ": final params", sampled.final_params != plain.final_params);
    tally.add(l.name + ": samples", sampled.samples != want.samples);
    if (world().rank == 0 && !sampled.samples.empty())
      std::printf("%s: sample at %d [%s] (single process [%s])\n", l.name.c_str(),
                  sampled.samples.back().first, show(sampled.samples.back().second).c_str(),
                  show(want.samples.back().second).c_str());
    tally.expect_clean(l.name.c_str());
  };
  for (const SampleLayout& l : layouts) check(l, ref);
  for (const SampleLayout& l : two_bw) check(l, ref_2bw);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  return strata::mpitest::run_all_tests(argc, argv);
}
