// The GPT dataset and blending (runtime/data/gpt_dataset.h) on in-memory corpora whose tokens
// say where they come from (document d, offset i → token d·1000 + i), so every property is
// checked against the documents themselves: a sample is seq_len + 1 consecutive tokens of one
// epoch's document order; an epoch's samples cover its stream once (no replacement); epochs
// differ; the stream is a pure function of (seed, sample index); train and validation never share
// a document; blending follows Megatron's greedy rule and its weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/gpt_dataset.h"

namespace strata {
namespace {

class MemoryCorpus final : public TokenCorpus {
 public:
  explicit MemoryCorpus(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {}
  std::string path() const override { return "memory"; }
  int64_t num_documents() const override { return static_cast<int64_t>(lengths_.size()); }
  int64_t document_length(int64_t d) const override { return lengths_[static_cast<size_t>(d)]; }
  int64_t num_tokens() const override {
    return std::accumulate(lengths_.begin(), lengths_.end(), int64_t{0});
  }
  int token_bytes() const override { return 4; }
  void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const override {
    EXPECT_LE(offset + count, document_length(d));
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(d * 1000 + offset + i);
  }
  std::string locate(int64_t d, int64_t offset) const override {
    return "document " + std::to_string(d) + " token " + std::to_string(offset);
  }

 private:
  std::vector<int64_t> lengths_;
};

std::shared_ptr<const TokenCorpus> corpus(std::vector<int64_t> lengths) {
  return std::make_shared<MemoryCorpus>(std::move(lengths));
}

TEST(KeyedPermutation, IsABijectionForEverySize) {
  for (uint64_t n : {1, 2, 3, 7, 64, 100, 1000, 4097}) {
    std::vector<int> seen(n, 0);
    for (uint64_t x = 0; x < n; ++x) ++seen[keyed_permutation(x, n, 42)];
    for (int c : seen) EXPECT_EQ(c, 1) << "n " << n;
  }
  // Another key, another order.
  int same = 0;
  for (uint64_t x = 0; x < 1000; ++x)
    same += keyed_permutation(x, 1000, 1) == keyed_permutation(x, 1000, 2);
  EXPECT_LT(same, 20);
}

TEST(GptDataset, EachEpochCoversItsStreamOnceAcrossDocumentBoundaries) {
  const int L = 8;
  const std::vector<int64_t> lengths = {5, 17, 3, 40, 9, 12, 30, 1, 22, 8};
  GptDataset train(corpus(lengths), Split::kTrain, 0.2, L, 7, 0);
  EXPECT_EQ(train.documents(), 8);
  const int64_t T = 5 + 17 + 3 + 40 + 9 + 12 + 30 + 1;
  EXPECT_EQ(train.tokens_per_epoch(), T);
  const int64_t n = train.samples_per_epoch();
  EXPECT_EQ(n, (T - 1) / L);
  std::vector<std::vector<int32_t>> epochs[2];
  for (uint64_t e = 0; e < 2; ++e) {
    std::multiset<int32_t> starts_seen;
    for (int64_t j = 0; j < n; ++j) {
      std::vector<int32_t> t(L + 1);
      train.read_sample(e * n + static_cast<uint64_t>(j), t.data());
      epochs[e].push_back(t);
      // Only training documents (0..7), each token once per document run.
      for (int32_t x : t) EXPECT_LT(x / 1000, 8);
      starts_seen.insert(t[0]);
    }
    // The samples tile one permutation of the documents: their first tokens are distinct.
    EXPECT_EQ(std::set<int32_t>(starts_seen.begin(), starts_seen.end()).size(), starts_seen.size());
    // Every sample's tokens are consecutive within a document or continue at the start of one.
    for (const auto& t : epochs[e])
      for (int i = 1; i <= L; ++i)
        EXPECT_TRUE(t[i] == t[i - 1] + 1 || t[i] % 1000 == 0) << t[i - 1] << " → " << t[i];
  }
  EXPECT_NE(epochs[0], epochs[1]);  // each epoch its own document and sample order
}

TEST(GptDataset, APureFunctionOfSeedAndIndexFromAnyThread) {
  const std::vector<int64_t> lengths(50, 37);
  GptDataset a(corpus(lengths), Split::kTrain, 0.1, 16, 3, 0);
  GptDataset b(corpus(lengths), Split::kTrain, 0.1, 16, 3, 0);
  GptDataset c(corpus(lengths), Split::kTrain, 0.1, 16, 4, 0);
  std::vector<int32_t> x(17), y(17), z(17);
  int differ = 0;
  // b reads backwards and across epochs: what came before never matters.
  for (int s = 299; s >= 0; --s) {
    a.read_sample(static_cast<uint64_t>(s), x.data());
    b.read_sample(static_cast<uint64_t>(299 - s), y.data());
    b.read_sample(static_cast<uint64_t>(s), y.data());
    c.read_sample(static_cast<uint64_t>(s), z.data());
    EXPECT_EQ(x, y) << s;
    differ += x != z;
  }
  EXPECT_GT(differ, 250);  // another seed, another stream
  std::vector<std::vector<int32_t>> serial(200, std::vector<int32_t>(17)), threaded = serial;
  for (int s = 0; s < 200; ++s) a.read_sample(static_cast<uint64_t>(s), serial[s].data());
  std::vector<std::thread> pool;
  for (int w = 0; w < 4; ++w)
    pool.emplace_back([&, w] {
      for (int s = w; s < 200; s += 4) b.read_sample(static_cast<uint64_t>(s), threaded[s].data());
    });
  for (auto& t : pool) t.join();
  EXPECT_EQ(serial, threaded);
}

TEST(GptDataset, TrainAndValidationSplitByDocument) {
  const std::vector<int64_t> lengths(10, 20);
  GptDataset val(corpus(lengths), Split::kVal, 0.25, 8, 1, 0);
  EXPECT_EQ(val.documents(), 3);  // ⌈10 · 0.25⌉, the last three
  std::vector<int32_t> t(9);
  for (uint64_t s = 0; s < 50; ++s) {
    val.read_sample(s, t.data());
    for (int32_t x : t) EXPECT_GE(x / 1000, 7);
  }
}

TEST(GptDataset, BadCorporaAndTokensAreInputErrors) {
  EXPECT_THROW(GptDataset(corpus({100}), Split::kTrain, 0.1, 8, 1, 0), InputError);   // one doc
  EXPECT_THROW(GptDataset(corpus({4, 4}), Split::kTrain, 0.5, 8, 1, 0), InputError);  // short
  GptDataset small_vocab(corpus({30, 30, 30}), Split::kTrain, 0.3, 8, 1, 1005);
  std::vector<int32_t> t(9);
  try {
    for (uint64_t s = 0; s < 10; ++s) small_vocab.read_sample(s, t.data());
    FAIL() << "a token beyond the vocabulary was not reported";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary 1005"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("document"), std::string::npos) << e.what();
  }
}

// Megatron's build_blending_indices, written out: the counts of every prefix stay within one
// sample of the weights, and the assignment of a sample never depends on what was asked before.
TEST(Blend, FollowsMegatronsGreedyRuleAndWeights) {
  const std::vector<double> w = {0.5, 0.3, 0.2};
  Blend blend({5, 3, 2});  // normalised
  std::vector<uint64_t> taken(3, 0);
  for (uint64_t s = 0; s < 1000; ++s) {
    const double at = static_cast<double>(std::max<uint64_t>(s, 1));
    int best = 0;
    for (int d = 1; d < 3; ++d)
      if (w[d] * at - taken[d] > w[best] * at - taken[best]) best = d;
    const auto [d, i] = blend.assign(s);
    EXPECT_EQ(d, best) << s;
    EXPECT_EQ(i, taken[best]) << s;
    ++taken[best];
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(static_cast<double>(taken[k]), w[k] * (s + 1), 1.5);
  }
  Blend again({5, 3, 2});
  EXPECT_EQ(again.assign(777), blend.assign(777));  // straight to 777, after asking for 999
  EXPECT_EQ(again.assign(3), blend.assign(3));      // back to an earlier one
  Blend zero({1, 0});
  for (uint64_t s = 0; s < 20; ++s) EXPECT_EQ(zero.assign(s).first, 0);
}

}  // namespace
}  // namespace strata
