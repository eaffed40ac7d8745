// `strata eval --task` against log-likelihoods computed with Hugging Face transformers
// (tests/golden/eval/mc_reference.json, written by tests/golden/eval/make_eval_fixture.py from the
// tiny models of tests/golden/generate/ in float64): every ending's log-likelihood within 1e-4
// (Strata computes in float32: the fixture's float64 values differ from a float32 evaluation by
// ~1e-6 on these sums of ≤ 6 terms), and acc and acc_norm exactly. Alone (mpi_eval_np1) and with
// the model split over two tensor-parallel ranks (mpi_eval_tp2: STRATA_TEST_EVAL_SETS as --set
// overrides). Bad task files are named by file and line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "launch/commands/eval.h"
#include "mpi_test_util.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

const std::string kGolden = std::string(STRATA_TEST_DIR) + "/golden";

InferenceSource source(const std::string& model) {
  InferenceSource s;
  s.hf = kGolden + "/generate/" + model;
  if (const char* sets = std::getenv("STRATA_TEST_EVAL_SETS")) s.sets.push_back(sets);
  return s;
}

TEST(Eval, MultipleChoiceMatchesTransformers) {
  std::ifstream f(kGolden + "/eval/mc_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  for (const char* model : {"hf_gpt2_tiny", "hf_llama_tiny"}) {
    SCOPED_TRACE(model);
    const nlohmann::json want = ref["models"][model];
    const nlohmann::json got = evaluate_task(source(model), kGolden + "/eval/mc_ids.jsonl");
    EXPECT_EQ(got["examples"], 16);
    EXPECT_EQ(got["acc"].get<double>(), want["acc"].get<double>());
    EXPECT_EQ(got["acc_norm"].get<double>(), want["acc_norm"].get<double>());
    for (size_t e = 0; e < 16; ++e)
      for (size_t c = 0; c < 4; ++c)
        EXPECT_NEAR(got["loglikelihoods"][e][c].get<double>(),
                    want["loglikelihoods"][e][c].get<double>(), 1e-4)
            << "example " << e << " ending " << c;
  }
}

TEST(Eval, BadTaskFilesAreNamed) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/bad_task_" + std::to_string(::getpid()) + ".jsonl";
  for (const auto& [text, where] : std::vector<std::pair<std::string, std::string>>{
           {"{\"ctx_ids\": [1, 2], \"endings_ids\": [[3], [4]], \"label\": 2}\n", "line 1: label"},
           {"{\"ctx_ids\": [1], \"endings_ids\": [[3], [400]], \"label\": 0}\n",
            "line 1: endings_ids[1][0]"},
           {"\n{\"endings_ids\": [[3], [4]], \"label\": 0}\n", "line 2"},
           // Ids are integers in [0, vocab), named as given: before, 4294967301 was scored as 5
           // (wrapped to int32), -4294967291 and 1.9 were accepted, and 10^12 was refused with
           // another number.
           {"{\"ctx_ids\": [1, 4294967301], \"endings_ids\": [[3], [4]], \"label\": 0}\n",
            "line 1: ctx_ids[1]"},
           {"{\"ctx_ids\": [-4294967291], \"endings_ids\": [[3], [4]], \"label\": 0}\n",
            "line 1: ctx_ids[0]"},
           {"{\"ctx_ids\": [1], \"endings_ids\": [[3], [1.9]], \"label\": 0}\n",
            "line 1: endings_ids[1][0]"},
           {"{\"ctx_ids\": [1000000000000], \"endings_ids\": [[3], [4]], \"label\": 0}\n",
            "line 1: ctx_ids[0]"},
           {"{\"ctx_ids\": [1], \"endings_ids\": [[3], [4]], \"label\": 18446744073709551615}\n",
            "line 1: label"}}) {
    {
      std::ofstream out(path);
      out << text;
    }
    try {
      evaluate_task(source("hf_gpt2_tiny"), path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.where(), where) << e.what();
      // The value given, as written.
      for (const char* v :
           {"4294967301", "-4294967291", "1.9", "1000000000000", "18446744073709551615"})
        if (text.find(v) != std::string::npos) {
          EXPECT_NE(std::string(e.what()).find(std::string("got ") + v), std::string::npos)
              << e.what();
        }
    }
  }
  std::filesystem::remove(path);
}

// A config.json whose sizes its weights do not hold is refused before anything of its size is
// built (so the refusal comes at once rather than after minutes of allocation), naming the key
// (before: 100,000 layers with weights for 2, or 2^31 − 1 positions, allocated for minutes, or died
// with a bare std::bad_alloc).
TEST(Eval, ConfigSizesAreCheckedAgainstTheWeightsFirst) {
  const std::string dir = ::testing::TempDir() + "/absurd_" + std::to_string(::getpid());
  for (const auto& [model, key, value] : std::vector<std::tuple<std::string, std::string, double>>{
           {"hf_llama_tiny", "num_hidden_layers", 100000},
           {"hf_llama_tiny", "num_hidden_layers", 1e9},
           {"hf_llama_tiny", "max_position_embeddings", 2147483647},
           {"hf_llama_tiny", "max_position_embeddings", 1e7},
           {"hf_llama_tiny", "hidden_size", 4096},
           {"hf_gpt2_tiny", "n_layer", 3}}) {
    SCOPED_TRACE(model + " " + key);
    std::filesystem::remove_all(dir);
    std::filesystem::copy(kGolden + "/generate/" + model, dir);
    nlohmann::json cfg;
    {
      std::ifstream f(dir + "/config.json");
      cfg = nlohmann::json::parse(f);
    }
    cfg[key] = static_cast<int64_t>(value);
    if (key == "hidden_size") cfg["head_dim"] = 4096 / 4;
    std::ofstream(dir + "/config.json") << cfg.dump();
    InferenceSource src;
    src.hf = dir;
    try {
      evaluate_task(src, kGolden + "/eval/mc_ids.jsonl");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), dir + "/config.json") << e.what();
      EXPECT_EQ(e.where(), key) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  return strata::mpitest::run_all_tests(argc, argv);
}
