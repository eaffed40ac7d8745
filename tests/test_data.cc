// test_data.cc — the data sources of runtime/data/data_source.h.
//
// Expected values come from outside the code under test: closed forms for the entropy rate and
// loss floor of hand-built chains, the file bytes we wrote ourselves for text and tokens, and
// statistics of a long sampled stream for the synthetic chain (tolerances in standard errors).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/data_internal.h"
#include "runtime/data/data_source.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
namespace di = data_internal;

const char kConfig[] = "cfg.json";

// Binary entropy in nats, written out independently of data.cc.
double Hb(double p) {
  return -p * std::log(p) - (1 - p) * std::log(1 - p);
}

DataConfig synthetic_config(int vocab, int order, uint64_t seed) {
  DataConfig d;
  d.source = "synthetic";
  d.synthetic.vocab_size = vocab;
  d.synthetic.order = order;
  d.synthetic.seed = seed;
  return d;
}

struct Batch {
  std::vector<int32_t> inputs, targets;  // (count, seq_len)
};

Batch draw(const DataSource& src, Split split, uint64_t iter, int64_t first, int count,
           int seq_len) {
  Batch b;
  b.inputs.assign(static_cast<size_t>(count) * seq_len, -1);
  b.targets.assign(static_cast<size_t>(count) * seq_len, -1);
  src.sample(split, iter, first, count, seq_len, b.inputs.data(), b.targets.data());
  return b;
}

// Runs f, which must throw InputError, and returns it.
InputError expect_input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an InputError";
  return InputError("", "", "");
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- the counter-based hash ----

TEST(DataHash, KeyDependsOnEveryArgument) {
  const uint64_t k = di::sequence_key(1, Split::kTrain, 2, 3);
  EXPECT_EQ(k, di::sequence_key(1, Split::kTrain, 2, 3));
  EXPECT_NE(k, di::sequence_key(2, Split::kTrain, 2, 3));
  EXPECT_NE(k, di::sequence_key(1, Split::kVal, 2, 3));
  EXPECT_NE(k, di::sequence_key(1, Split::kTrain, 3, 3));
  EXPECT_NE(k, di::sequence_key(1, Split::kTrain, 2, 4));
  // Swapping iteration and index must not give the same sequence.
  EXPECT_NE(di::sequence_key(1, Split::kTrain, 2, 3), di::sequence_key(1, Split::kTrain, 3, 2));
}

TEST(DataHash, UnitDoublesAreUniform) {
  // Mean 1/2 and variance 1/12 of U[0,1), within 5 standard errors over 10^5 words.
  const int n = 100000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = di::unit_double(di::stream_word(42, i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum2 += u * u;
  }
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 5 * 0.0745 / std::sqrt(n));
}

// ---- Markov analysis against closed forms ----

TEST(DataMarkov, TwoStateChainClosedForm) {
  // P = [[1-a, a], [b, 1-b]]: pi = (b, a) / (a + b), h = pi0 H(a) + pi1 H(b).
  const double a = 0.1, b = 0.3;
  const std::vector<double> p = {1 - a, a, b, 1 - b};
  const di::MarkovAnalysis m = di::analyze_markov(p, 2, 1);
  EXPECT_NEAR(m.stationary[0], b / (a + b), 1e-11);
  EXPECT_NEAR(m.stationary[1], a / (a + b), 1e-11);
  const double h = b / (a + b) * Hb(a) + a / (a + b) * Hb(b);
  EXPECT_NEAR(m.entropy_rate, h, 1e-11);
  EXPECT_NEAR(di::markov_entropy_rate(p, 2, 1), h, 1e-11);
  // Order 1: token 0 is a full context for token 1, so every position costs h.
  EXPECT_TRUE(m.short_context_entropy.empty());
  EXPECT_NEAR(di::markov_loss_floor(m, 1), h, 1e-11);
  EXPECT_NEAR(di::markov_loss_floor(m, 100), h, 1e-11);
}

TEST(DataMarkov, OrderTwoChainClosedForm) {
  // Binary order-2 chain with P(1 | x, y) = p_y if x = 0 and 1 - p_y if x = 1. The pair (y, z)
  // is entered from (0, y) and (1, y) with total probability P(z|0,y) + P(z|1,y) = 1, so the
  // stationary distribution over pairs is uniform: single tokens are uniform (H_1 = log 2),
  // pairs too (H_2 = log 4), h = (H(p_0) + H(p_1)) / 2, and position 0 (one token of context)
  // costs H_2 - H_1 = log 2.
  const double p0 = 0.1, p1 = 0.3;
  // Context index = 2 x + y (oldest token most significant); row = (P(0|ctx), P(1|ctx)).
  const std::vector<double> t = {1 - p0, p0,       // (0, 0)
                                 1 - p1, p1,       // (0, 1)
                                 p0,     1 - p0,   // (1, 0)
                                 p1,     1 - p1};  // (1, 1)
  const di::MarkovAnalysis m = di::analyze_markov(t, 2, 2);
  for (double pi : m.stationary) EXPECT_NEAR(pi, 0.25, 1e-11);
  const double h = (Hb(p0) + Hb(p1)) / 2;
  EXPECT_NEAR(m.entropy_rate, h, 1e-11);
  ASSERT_EQ(m.short_context_entropy.size(), 1u);
  EXPECT_NEAR(m.short_context_entropy[0], std::log(2.0), 1e-11);
  for (int L : {1, 2, 7, 64, 1000}) {
    EXPECT_NEAR(di::markov_loss_floor(m, L), (std::log(2.0) + (L - 1) * h) / L, 1e-11) << L;
  }
}

TEST(DataMarkov, OrderTwoTableOfAnOrderOneChain) {
  // A table of order 2 whose rows ignore the older token is the two-state chain above: the
  // same rate, and one token of context already suffices, so the floor equals the rate.
  const double a = 0.2, b = 0.05;
  const std::vector<double> t = {1 - a, a, b, 1 - b, 1 - a, a, b, 1 - b};
  const di::MarkovAnalysis m = di::analyze_markov(t, 2, 2);
  const double h = b / (a + b) * Hb(a) + a / (a + b) * Hb(b);
  EXPECT_NEAR(m.entropy_rate, h, 1e-11);
  // pi(x, y) = pi(x) P(y | x).
  EXPECT_NEAR(m.stationary[1], b / (a + b) * a, 1e-11);
  EXPECT_NEAR(m.stationary[2], a / (a + b) * b, 1e-11);
  EXPECT_NEAR(di::markov_loss_floor(m, 10), h, 1e-11);
}

TEST(DataMarkov, SyntheticRowsAreDistributions) {
  const std::vector<double> t = di::synthetic_transitions(16, 2, 3);
  ASSERT_EQ(t.size(), 16u * 16u * 16u);
  for (int c = 0; c < 256; ++c) {
    double sum = 0;
    for (int v = 0; v < 16; ++v) {
      EXPECT_GT(t[c * 16 + v], 0.0);
      sum += t[c * 16 + v];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  // Deterministic in the seed, different across seeds.
  EXPECT_EQ(t, di::synthetic_transitions(16, 2, 3));
  EXPECT_NE(t, di::synthetic_transitions(16, 2, 4));
}

// ---- the synthetic source ----

TEST(DataSynthetic, DeterministicAndLayoutIndependent) {
  const auto a = make_data_source(synthetic_config(64, 2, 7), 1234, 32, kConfig);
  const auto b = make_data_source(synthetic_config(64, 2, 7), 1234, 32, kConfig);
  const Batch whole = draw(*a, Split::kTrain, 5, 0, 8, 32);
  const Batch again = draw(*b, Split::kTrain, 5, 0, 8, 32);
  EXPECT_EQ(whole.inputs, again.inputs);
  EXPECT_EQ(whole.targets, again.targets);

  // [0, 4) + [4, 8) and a single middle slot give the same sequences as [0, 8) at once.
  const Batch lo = draw(*a, Split::kTrain, 5, 0, 4, 32);
  const Batch hi = draw(*a, Split::kTrain, 5, 4, 4, 32);
  std::vector<int32_t> joined = lo.inputs;
  joined.insert(joined.end(), hi.inputs.begin(), hi.inputs.end());
  EXPECT_EQ(joined, whole.inputs);
  joined = lo.targets;
  joined.insert(joined.end(), hi.targets.begin(), hi.targets.end());
  EXPECT_EQ(joined, whole.targets);
  const Batch one = draw(*a, Split::kTrain, 5, 6, 1, 32);
  EXPECT_TRUE(std::equal(one.inputs.begin(), one.inputs.end(), whole.inputs.begin() + 6 * 32));

  // Another iteration, another sampling seed: different tokens.
  EXPECT_NE(draw(*a, Split::kTrain, 6, 0, 8, 32).inputs, whole.inputs);
  const auto c = make_data_source(synthetic_config(64, 2, 7), 1235, 32, kConfig);
  EXPECT_NE(draw(*c, Split::kTrain, 5, 0, 8, 32).inputs, whole.inputs);
}

TEST(DataSynthetic, TargetsAreInputsShiftedAndSplitsDiffer) {
  const int L = 48, n = 16;
  const auto src = make_data_source(synthetic_config(64, 2, 7), 99, L, kConfig);
  EXPECT_EQ(src->vocab_size(), 64);
  const Batch train = draw(*src, Split::kTrain, 0, 0, n, L);
  const Batch val = draw(*src, Split::kVal, 0, 0, n, L);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i + 1 < L; ++i) {
      ASSERT_EQ(train.targets[r * L + i], train.inputs[r * L + i + 1]) << r << "," << i;
    }
  }
  for (int32_t t : train.inputs) ASSERT_TRUE(t >= 0 && t < 64);
  for (int32_t t : train.targets) ASSERT_TRUE(t >= 0 && t < 64);
  EXPECT_NE(train.inputs, val.inputs);
}

TEST(DataSynthetic, DescribeAndRate) {
  const auto src = make_data_source(synthetic_config(64, 2, 7), 1, 64, kConfig);
  const double h = di::markov_entropy_rate(di::synthetic_transitions(64, 2, 7), 64, 2);
  ASSERT_TRUE(src->entropy_rate().has_value());
  EXPECT_DOUBLE_EQ(*src->entropy_rate(), h);
  // Softmax of 2.5 z over 64 tokens: well below the uniform log 64 but far from deterministic.
  EXPECT_GT(h, 1.0);
  EXPECT_LT(h, std::log(64.0));
  EXPECT_TRUE(contains(src->describe(), "synthetic Markov chain: vocab 64, order 2, entropy rate"))
      << src->describe();
}

TEST(DataSynthetic, LossFloorAboveRateAndConverging) {
  for (int order : {2, 3}) {
    const auto src = make_data_source(synthetic_config(16, order, 7), 1, 64, kConfig);
    const double h = *src->entropy_rate();
    double prev = *src->loss_floor(1);
    for (int L : {2, 4, 16, 64, 256, 4096}) {
      const double f = *src->loss_floor(L);
      EXPECT_GT(f, h) << "order " << order << " L " << L;
      EXPECT_LT(f, prev) << "order " << order << " L " << L;
      prev = f;
    }
    // The excess is a fixed sum over the k-1 short positions divided by L.
    const double excess64 = 64 * (*src->loss_floor(64) - h);
    EXPECT_NEAR(4096 * (*src->loss_floor(4096) - h), excess64, 1e-9);
    EXPECT_LT(*src->loss_floor(1 << 20) - h, 1e-5);
  }
  // Order 1: token 0 is already a full context.
  const auto o1 = make_data_source(synthetic_config(64, 1, 7), 1, 64, kConfig);
  EXPECT_DOUBLE_EQ(*o1->loss_floor(64), *o1->entropy_rate());
}

// The statistics of a long sampled stream match the chain the source claims: the mean ideal
// loss equals the entropy rate and the loss floor, next-token frequencies equal the table, and
// first tokens follow the stationary marginal.
TEST(DataSynthetic, EmpiricalStatisticsMatchTheChain) {
  const int V = 64, k = 2, L = 128, n = 8000;
  const auto src = make_data_source(synthetic_config(V, k, 7), 2024, L, kConfig);
  const std::vector<double> P = di::synthetic_transitions(V, k, 7);
  const di::MarkovAnalysis m = di::analyze_markov(P, V, k);
  const Batch b = draw(*src, Split::kTrain, 3, 0, n, L);

  // Per-sequence mean losses are independent across sequences, so their spread gives the
  // standard error without assuming independence along a sequence.
  std::vector<double> full_mean(n), all_mean(n);
  std::vector<int64_t> first_token(V, 0);
  std::map<int, std::vector<int64_t>> next_counts;  // context -> counts of next token
  for (int r = 0; r < n; ++r) {
    const int32_t* x = &b.inputs[r * L];
    const int32_t* y = &b.targets[r * L];
    ++first_token[x[0]];
    // Position 0: one token of context; its ideal loss uses the stationary pair distribution.
    double row0 = 0;
    for (int v = 0; v < V; ++v) row0 += m.stationary[x[0] * V + v];
    double all = -std::log(m.stationary[x[0] * V + y[0]] / row0);
    double full = 0;
    for (int i = 1; i < L; ++i) {
      const int ctx = x[i - 1] * V + x[i];
      const double nll = -std::log(P[ctx * V + y[i]]);
      full += nll;
      all += nll;
      auto& counts = next_counts[ctx];
      if (counts.empty()) counts.assign(V, 0);
      ++counts[y[i]];
    }
    full_mean[r] = full / (L - 1);
    all_mean[r] = all / L;
  }
  auto mean_se = [](const std::vector<double>& v) {
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / v.size();
    const double var = (s2 - s * mean) / (v.size() - 1);
    return std::make_pair(mean, std::sqrt(var / v.size()));
  };
  const auto [full, full_se] = mean_se(full_mean);
  const auto [all, all_se] = mean_se(all_mean);
  EXPECT_NEAR(full, *src->entropy_rate(), 4 * full_se) << "se " << full_se;
  EXPECT_NEAR(all, *src->loss_floor(L), 4 * all_se) << "se " << all_se;

  // First tokens: binomial counts against the stationary marginal of one token.
  for (int v = 0; v < V; ++v) {
    double p = 0;
    for (int w = 0; w < V; ++w) p += m.stationary[v * V + w];
    EXPECT_NEAR(first_token[v], n * p, 5 * std::sqrt(n * p * (1 - p)) + 1) << "token " << v;
  }

  // Next-token frequencies of the ten most visited contexts against their rows.
  std::vector<std::pair<int64_t, int>> visits;
  for (const auto& [ctx, counts] : next_counts) {
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    visits.push_back({total, ctx});
  }
  std::sort(visits.rbegin(), visits.rend());
  ASSERT_GE(visits.size(), 10u);
  for (int j = 0; j < 10; ++j) {
    const auto [total, ctx] = visits[j];
    ASSERT_GT(total, 500);
    for (int v = 0; v < V; ++v) {
      const double p = P[ctx * V + v];
      EXPECT_NEAR(next_counts[ctx][v], total * p, 5 * std::sqrt(total * p * (1 - p)) + 1)
          << "context " << ctx << " token " << v;
    }
  }
}

TEST(DataSynthetic, ShortSequencesUseThePrefixOfTheStartingContext) {
  // seq_len + 1 = 2 < order 3: the sequence is the first two tokens of the starting context,
  // which are the first two tokens of the sequence of the same slot with a longer seq_len.
  const auto src = make_data_source(synthetic_config(8, 3, 7), 5, 1, kConfig);
  const Batch s = draw(*src, Split::kTrain, 0, 0, 16, 1);
  const Batch l = draw(*src, Split::kTrain, 0, 0, 16, 10);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(s.inputs[r], l.inputs[r * 10]);
    EXPECT_EQ(s.targets[r], l.inputs[r * 10 + 1]);
  }
}

TEST(DataSynthetic, RefusesBadConfig) {
  auto e = expect_input_error([] { make_data_source(synthetic_config(64, 0, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.file(), kConfig);
  EXPECT_EQ(e.where(), "data.synthetic.order");
  e = expect_input_error([] { make_data_source(synthetic_config(64, 5, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.synthetic.order");
  e = expect_input_error([] { make_data_source(synthetic_config(1, 1, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.synthetic.vocab_size");
  e = expect_input_error([] { make_data_source(synthetic_config(65537, 1, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.synthetic.vocab_size");
  // 64^4 = 2^24 contexts: over the 2^22 limit, and the message says so.
  e = expect_input_error([] { make_data_source(synthetic_config(64, 4, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.synthetic");
  EXPECT_TRUE(contains(e.what(), "4194304")) << e.what();
  EXPECT_TRUE(contains(e.what(), "64^4")) << e.what();
  // 65536^4 must not overflow into a small number.
  e = expect_input_error([] { make_data_source(synthetic_config(65536, 4, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.synthetic");
  // 65536 contexts of order 1 pass the context limit but not the dense table's 2^24 entries.
  e = expect_input_error([] { make_data_source(synthetic_config(65536, 1, 7), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.synthetic");
  EXPECT_TRUE(contains(e.what(), "16777216")) << e.what();

  DataConfig bad = synthetic_config(64, 2, 7);
  bad.source = "random";
  e = expect_input_error([&] { make_data_source(bad, 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.source");
  e = expect_input_error([] { make_data_source(synthetic_config(64, 2, 7), 1, 0, kConfig); });
  EXPECT_EQ(e.where(), "model.seq_len");
}

// ---- text and tokens files ----

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("strata_test_data_" + std::to_string(getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  // An llm.c token file: header (magic, version, count), then `tokens` as uint16 LE; the
  // header's count can lie and `extra` bytes can follow, to make broken files.
  std::string write_bin(const std::string& name, const std::vector<uint16_t>& tokens,
                        int32_t magic = 20240520, int32_t version = 1, int32_t count = -1) {
    std::string b(1024, '\0');
    auto put32 = [&](int at, int32_t v) {
      for (int i = 0; i < 4; ++i)
        b[at + i] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xFF);
    };
    put32(0, magic);
    put32(4, version);
    put32(8, count < 0 ? static_cast<int32_t>(tokens.size()) : count);
    for (uint16_t t : tokens) {
      b.push_back(static_cast<char>(t & 0xFF));
      b.push_back(static_cast<char>(t >> 8));
    }
    return write(name, b);
  }

  static DataConfig file_config(const std::string& source, const std::string& path,
                                double val_fraction = 0.1) {
    DataConfig d;
    d.source = source;
    d.path = path;
    d.val_fraction = val_fraction;
    return d;
  }

  fs::path dir_;
};

TEST_F(DataFiles, TextWindowsComeFromTheirSplit) {
  // 900 bytes of 'a'..'z' cycling, then 100 of 'A'..'Z': the train split is exactly the
  // lowercase part, validation exactly the uppercase part.
  std::string text;
  for (int i = 0; i < 900; ++i) text += static_cast<char>('a' + i % 26);
  for (int i = 0; i < 100; ++i) text += static_cast<char>('A' + i % 26);
  const std::string path = write("t.txt", text);
  const int L = 16, n = 32;
  const auto src = make_data_source(file_config("text", path), 77, L, kConfig);
  EXPECT_EQ(src->vocab_size(), 256);
  EXPECT_EQ(src->describe(), "text " + path + " (1000 bytes, train 900, val 100)");
  EXPECT_FALSE(src->entropy_rate().has_value());
  EXPECT_FALSE(src->loss_floor(L).has_value());

  for (Split split : {Split::kTrain, Split::kVal}) {
    const Batch b = draw(*src, split, 4, 10, n, L);
    const int base = split == Split::kTrain ? 'a' : 'A';
    for (int r = 0; r < n; ++r) {
      // Consecutive letters of the cycle: a window of the split, targets one further.
      const int32_t* x = &b.inputs[r * L];
      const int32_t* y = &b.targets[r * L];
      for (int i = 0; i < L; ++i) {
        ASSERT_GE(x[i], base);
        ASSERT_LT(x[i], base + 26);
        ASSERT_EQ(y[i], base + (x[i] - base + 1) % 26);
      }
    }
  }
  EXPECT_NE(draw(*src, Split::kTrain, 4, 0, n, L).inputs,
            draw(*src, Split::kVal, 4, 0, n, L).inputs);

  // Determinism and layout independence.
  const auto again = make_data_source(file_config("text", path), 77, L, kConfig);
  const Batch whole = draw(*src, Split::kTrain, 9, 0, 8, L);
  EXPECT_EQ(whole.inputs, draw(*again, Split::kTrain, 9, 0, 8, L).inputs);
  Batch lo = draw(*src, Split::kTrain, 9, 0, 4, L);
  const Batch hi = draw(*src, Split::kTrain, 9, 4, 4, L);
  lo.inputs.insert(lo.inputs.end(), hi.inputs.begin(), hi.inputs.end());
  lo.targets.insert(lo.targets.end(), hi.targets.begin(), hi.targets.end());
  EXPECT_EQ(lo.inputs, whole.inputs);
  EXPECT_EQ(lo.targets, whole.targets);
}

TEST_F(DataFiles, TextSplitOfExactlyOneSequenceStartsAtItsBeginning) {
  // 100 bytes, val 10% = 10 bytes = seq_len + 1 for seq_len 9: the only window is the split.
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('0' + i % 10);
  const auto src = make_data_source(file_config("text", write("one.txt", text)), 1, 9, kConfig);
  const Batch b = draw(*src, Split::kVal, 0, 0, 3, 9);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 9; ++i) {
      EXPECT_EQ(b.inputs[r * 9 + i], '0' + i);
      EXPECT_EQ(b.targets[r * 9 + i], '0' + i + 1);
    }
  }
}

TEST_F(DataFiles, Utf8Validation) {
  auto first_bad = [](const std::string& s) {
    return di::first_invalid_utf8(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  const std::string ok = "plain, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9D\x84\x9E, \xF4\x8F\xBF\xBF";
  EXPECT_EQ(first_bad(ok), ok.size());
  EXPECT_EQ(first_bad("ab\xFF"
                      "cd"),
            2u);                                 // never a lead byte
  EXPECT_EQ(first_bad("ab\x80"), 2u);            // continuation without a lead
  EXPECT_EQ(first_bad("abc\xE2\x82"), 3u);       // truncated at the end
  EXPECT_EQ(first_bad("a\xE2(\xAC"), 1u);        // bad continuation
  EXPECT_EQ(first_bad("a\xC0\x80"), 1u);         // overlong NUL
  EXPECT_EQ(first_bad("a\xE0\x80\xAF"), 1u);     // overlong '/'
  EXPECT_EQ(first_bad("ab\xED\xA0\x80"), 2u);    // UTF-16 surrogate
  EXPECT_EQ(first_bad("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF

  // Through the source: the error names the file and the offset of the bad sequence.
  std::string text(300, 'x');
  text.replace(137, 3, "\xE2\x82(");
  const std::string path = write("bad.txt", text);
  const InputError e =
      expect_input_error([&] { make_data_source(file_config("text", path), 1, 8, kConfig); });
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.where(), "byte 137");
  EXPECT_TRUE(contains(e.what(), "UTF-8")) << e.what();
}

TEST_F(DataFiles, TextTooShortForOneSequence) {
  // 100 bytes: train 90, val 10; seq_len 16 needs 17 per split, so validation (byte 90) fails.
  const std::string path = write("short.txt", std::string(100, 'z'));
  InputError e =
      expect_input_error([&] { make_data_source(file_config("text", path), 1, 16, kConfig); });
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.where(), "byte 90");
  EXPECT_TRUE(contains(e.what(), "17")) << e.what();
  EXPECT_TRUE(contains(e.what(), "found 10")) << e.what();
  // seq_len 100 fails already in the train split, at byte 0.
  e = expect_input_error([&] { make_data_source(file_config("text", path), 1, 100, kConfig); });
  EXPECT_EQ(e.where(), "byte 0");
  EXPECT_TRUE(contains(e.what(), "101")) << e.what();
  EXPECT_TRUE(contains(e.what(), "found 90")) << e.what();
  // An empty file too.
  const std::string empty = write("empty.txt", "");
  e = expect_input_error([&] { make_data_source(file_config("text", empty), 1, 4, kConfig); });
  EXPECT_EQ(e.file(), empty);
}

TEST_F(DataFiles, PathAndFractionChecks) {
  DataConfig d = file_config("text", "");
  d.path.reset();
  InputError e = expect_input_error([&] { make_data_source(d, 1, 8, kConfig); });
  EXPECT_EQ(e.file(), kConfig);
  EXPECT_EQ(e.where(), "data.path");
  d.source = "tokens";
  e = expect_input_error([&] { make_data_source(d, 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.path");

  const std::string missing = (dir_ / "no_such_file.bin").string();
  for (const char* source : {"text", "tokens"}) {
    e = expect_input_error([&] { make_data_source(file_config(source, missing), 1, 8, kConfig); });
    EXPECT_EQ(e.file(), kConfig);
    EXPECT_EQ(e.where(), "data.path");
    EXPECT_TRUE(contains(e.what(), missing)) << e.what();
  }
  e = expect_input_error(
      [&] { make_data_source(file_config("text", dir_.string()), 1, 8, kConfig); });
  EXPECT_EQ(e.where(), "data.path");

  const std::string path = write("ok.txt", std::string(1000, 'q'));
  for (double f : {0.0, 1.0, -0.5, 1.5}) {
    e = expect_input_error([&] { make_data_source(file_config("text", path, f), 1, 8, kConfig); });
    EXPECT_EQ(e.file(), kConfig);
    EXPECT_EQ(e.where(), "data.val_fraction") << f;
  }
}

TEST_F(DataFiles, TokensFile) {
  // 1000 tokens t_i = (7 i) mod 5003: a sample is recognisable by consecutive differences of 7
  // (mod 5003), which break only where it crosses from one document (a chunk of the shard) into
  // the next. 1000 tokens at seq 32 are re-cut into chunks of 8 · 33 = 264 tokens: 4 documents,
  // the last (208 tokens, from token 792) the validation split.
  std::vector<uint16_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = static_cast<uint16_t>((7 * i) % 5003);
  const std::string path = write_bin("ok.bin", tokens);
  const int L = 32, n = 16;
  const auto src = make_data_source(file_config("tokens", path), 3, L, kConfig);
  EXPECT_EQ(src->vocab_size(), 0);  // the model's: ids are checked against it as they are read
  EXPECT_TRUE(contains(src->describe(), "4 documents, 1000 tokens")) << src->describe();
  for (Split split : {Split::kTrain, Split::kVal}) {
    const Batch b = draw(*src, split, 2, 0, n, L);
    for (int r = 0; r < n; ++r) {
      const int32_t* x = &b.inputs[r * L];
      const int32_t* y = &b.targets[r * L];
      int jumps = 0;
      for (int i = 0; i < L; ++i) {
        const auto at = std::find(tokens.begin(), tokens.end(), static_cast<uint16_t>(x[i]));
        ASSERT_NE(at, tokens.end());
        const int pos = static_cast<int>(at - tokens.begin());
        if (split == Split::kTrain) {
          EXPECT_LT(pos, 792);
        } else {
          EXPECT_GE(pos, 792);
        }
        jumps += (y[i] - x[i] + 5003) % 5003 != 7;
      }
      EXPECT_LE(jumps, 1) << "sample " << r;  // at most one chunk boundary in 33 tokens
    }
  }
}

TEST_F(DataFiles, BrokenTokensFiles) {
  const std::vector<uint16_t> tokens(500, 3);
  auto load = [&](const std::string& p) {
    return expect_input_error([&] { make_data_source(file_config("tokens", p), 1, 8, kConfig); });
  };

  // Header claims 1000 tokens, 500 present: data ends at byte 1024 + 1000, 3024 expected.
  std::string p = write_bin("trunc.bin", tokens, 20240520, 1, 1000);
  InputError e = load(p);
  EXPECT_EQ(e.file(), p);
  EXPECT_EQ(e.where(), "byte 2024");
  EXPECT_TRUE(contains(e.what(), "3024")) << e.what();

  p = write_bin("magic.bin", tokens, 12345);
  e = load(p);
  EXPECT_EQ(e.file(), p);
  EXPECT_EQ(e.where(), "byte 0");
  EXPECT_TRUE(contains(e.what(), "20240520")) << e.what();
  EXPECT_TRUE(contains(e.what(), "12345")) << e.what();

  p = write_bin("version.bin", tokens, 20240520, 2);
  e = load(p);
  EXPECT_EQ(e.where(), "byte 4");
  EXPECT_TRUE(contains(e.what(), "found 2")) << e.what();

  // A negative count (write_bin reads -1 as "the real size", so this header is written by hand).
  std::string raw(1024, '\0');
  const int32_t hdr[3] = {20240520, 1, -5};
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < 4; ++i)
      raw[4 * k + i] = static_cast<char>((static_cast<uint32_t>(hdr[k]) >> (8 * i)) & 0xFF);
  }
  p = write("negative.bin", raw);
  e = load(p);
  EXPECT_EQ(e.where(), "byte 8");

  p = write("tiny.bin", std::string(100, '\0'));
  e = load(p);
  EXPECT_EQ(e.file(), p);
  EXPECT_EQ(e.where(), "byte 100");
  EXPECT_TRUE(contains(e.what(), "1024")) << e.what();

  // Header claims 400 of the 500 tokens: 200 bytes too many after byte 1824.
  p = write_bin("long.bin", tokens, 20240520, 1, 400);
  e = load(p);
  EXPECT_EQ(e.where(), "byte 1824");
  EXPECT_TRUE(contains(e.what(), "200")) << e.what();

  // 100 tokens at seq 32: one document (a chunk is at least 8 samples), nothing to split into
  // train and validation.
  p = write_bin("short.bin", std::vector<uint16_t>(100, 1));
  e = expect_input_error([&] { make_data_source(file_config("tokens", p), 1, 32, kConfig); });
  EXPECT_EQ(e.file(), p);
  EXPECT_EQ(e.where(), "documents");
  EXPECT_TRUE(contains(e.what(), "at least 2 documents")) << e.what();
  // 1868 tokens: seven chunks of 264 and a last of 20, the validation split (one document),
  // shorter than one sample of 33: refused with its token count.
  p = write_bin("val_short.bin", std::vector<uint16_t>(1868, 1));
  e = expect_input_error([&] { make_data_source(file_config("tokens", p, 0.01), 1, 32, kConfig); });
  EXPECT_EQ(e.file(), p);
  EXPECT_TRUE(contains(e.what(), "33 tokens in the validation split")) << e.what();
  EXPECT_TRUE(contains(e.what(), "found 20")) << e.what();
}

TEST(DataShared, TinyShakespeare) {
  const fs::path path = fs::path(STRATA_SHARED_DATA_DIR) / "tinyshakespeare.txt";
  if (!fs::exists(path)) {
    GTEST_SKIP() << "tinyshakespeare.txt not found in " << STRATA_SHARED_DATA_DIR;
  }
  const uint64_t size = fs::file_size(path);
  DataConfig d;
  d.source = "text";
  d.path = path.string();
  d.val_fraction = 0.1;
  const auto src = make_data_source(d, 1234, 64, kConfig);
  EXPECT_EQ(src->vocab_size(), 256);
  // The train split is the largest prefix within 90% of the file; validation the rest.
  const uint64_t train = static_cast<uint64_t>(std::floor(size * 0.9));
  EXPECT_EQ(src->describe(), "text " + path.string() + " (" + std::to_string(size) +
                                 " bytes, train " + std::to_string(train) + ", val " +
                                 std::to_string(size - train) + ")");

  // Validation windows are substrings of the last part of the file.
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(text.size(), size);
  const std::string val = text.substr(train);
  const Batch b = draw(*src, Split::kVal, 0, 0, 4, 64);
  for (int r = 0; r < 4; ++r) {
    std::string window;
    for (int i = 0; i < 64; ++i) window += static_cast<char>(b.inputs[r * 64 + i]);
    window += static_cast<char>(b.targets[r * 64 + 63]);
    EXPECT_NE(val.find(window), std::string::npos) << window;
  }
}

}  // namespace
}  // namespace strata
