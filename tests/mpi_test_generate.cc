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
#include "mpi_test_util.h"
#include "runtime/error.h"

namespace strata {
namespace {

const std::string kDir = std::string(STRATA_TEST_DIR) + "/golden/generate";

struct Case {
  std::vector<int32_t> prompt;
  int max_new_tokens = 0;
  std::vector<int32_t> ids;
};

std::string hf_dir(const std::string& arch) {
  return kDir + (arch == "gpt2" ? "/hf_gpt2_tiny" : "/hf_llama_tiny");
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
  o.hf = hf_dir(arch);
  o.sets = env_sets();
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
    EXPECT_EQ(g[0].ids, c.ids) << "got [" << show(g[0].ids) << "], transformers ["
                               << show(c.ids) << "]";
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
      EXPECT_EQ(g[i].ids, batch[i].ids) << "got [" << show(g[i].ids) << "], transformers ["
                                        << show(batch[i].ids) << "]";
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

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::mpitest::run_all_tests(argc, argv); }
