// Masked-LM samples (runtime/data/bert_dataset.h, runtime/data/masked_lm_source.h) checked
// against their definition, independently of the model:
//
//   * every sample is [CLS] A [SEP] B [SEP] [PAD]… with the token types, length and loss mask the
//     definition gives; its unmasked tokens and all its targets are the document's tokens — a
//     piece of one document (next), a piece and another document's run (random next, label 1),
//     or the piece's two halves swapped (sentence order, label 1);
//   * the counts: max(1, round(0.15·n)) positions predicted per sequence; over many samples
//     80% / 10% / 10% of them [MASK] / random / kept, half the labels 1, a tenth of the samples
//     shorter than they could be — each within 5 binomial standard deviations;
//   * a pure function of (seed, sample): the same sample from two datasets, another seed gives
//     other samples; the plan-only count (masked_tokens, loss_tokens) equals the loss mask;
//   * the source: the sequences of a global batch drawn whole equal the same drawn in slices
//     (what every layout relies on), for the synthetic chain's documents, a text file's
//     paragraphs and an indexed dataset; the special tokens' defaults and refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/bert_dataset.h"
#include "runtime/data/data_source.h"
#include "runtime/data/indexed.h"
#include "runtime/data/masked_lm_source.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kCls = 60, kSep = 61, kMask = 62, kPad = 63;

MaskedLmOptions options(bool sentence_order = false) {
  MaskedLmOptions o;
  o.cls = kCls;
  o.sep = kSep;
  o.mask = kMask;
  o.pad = kPad;
  o.random_vocab = 60;
  o.sentence_order = sentence_order;
  return o;
}

// Documents of random length in [2, 90) and tokens in [0, 60), from `seed`; each token's value
// is unique within its document's first 60 positions only by chance, so the checks below find
// runs by position, not by value.
std::shared_ptr<MemoryCorpus> corpus(int docs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens;
  std::vector<int64_t> start = {0};
  for (int d = 0; d < docs; ++d) {
    const int n = 2 + static_cast<int>(rng() % 88);
    for (int i = 0; i < n; ++i) tokens.push_back(static_cast<int32_t>(rng() % 60));
    start.push_back(static_cast<int64_t>(tokens.size()));
  }
  return std::make_shared<MemoryCorpus>("docs", std::move(tokens), std::move(start));
}

std::vector<int32_t> document(const TokenCorpus& c, int64_t d) {
  std::vector<int32_t> t(static_cast<size_t>(c.document_length(d)));
  c.read(d, 0, static_cast<int64_t>(t.size()), t.data());
  return t;
}

// Whether `run` is a contiguous run of some document of [first, last) (other than `not_doc`).
bool in_a_document(const TokenCorpus& c, const std::vector<int32_t>& run, int64_t first,
                   int64_t last, int64_t not_doc = -1) {
  for (int64_t d = first; d < last; ++d) {
    if (d == not_doc) continue;
    const std::vector<int32_t> t = document(c, d);
    if (t.size() < run.size()) continue;
    for (size_t at = 0; at + run.size() <= t.size(); ++at)
      if (std::equal(run.begin(), run.end(), t.begin() + static_cast<int64_t>(at))) return true;
  }
  return false;
}

struct Parsed {
  std::vector<int32_t> a, b;  // the segments' targets (original tokens)
  int masked = 0;
};

// Checks the layout of one sample and returns its segments.
Parsed parse(const MaskedLmSample& m, int S) {
  Parsed p;
  EXPECT_EQ(static_cast<int>(m.tokens.size()), S);
  const int n = m.length;
  EXPECT_GE(n, 5);
  EXPECT_LE(n, S);
  EXPECT_EQ(m.tokens[0], kCls);
  EXPECT_EQ(m.tokens[static_cast<size_t>(n - 1)], kSep);
  int first_sep = -1;
  for (int i = 1; i < n - 1; ++i)
    if (m.targets[static_cast<size_t>(i)] == kSep) {
      EXPECT_EQ(first_sep, -1) << "one [SEP] between the segments";
      first_sep = i;
    }
  EXPECT_GT(first_sep, 1);
  EXPECT_LT(first_sep, n - 2);
  for (int i = 0; i < S; ++i) {
    const size_t k = static_cast<size_t>(i);
    const int want_type = i > first_sep && i < n ? 1 : 0;
    EXPECT_EQ(m.token_types[k], want_type) << "position " << i;
    const bool segment = i > 0 && i < n - 1 && i != first_sep;
    if (!segment) {
      EXPECT_EQ(m.loss_mask[k], 0.0f) << "position " << i;
    }
    if (i >= n) {
      EXPECT_EQ(m.tokens[k], kPad);
    }
    if (m.loss_mask[k] == 0.0f) {
      EXPECT_EQ(m.tokens[k], m.targets[k]) << "position " << i;
    }
    p.masked += m.loss_mask[k] != 0.0f;
    if (segment) (i < first_sep ? p.a : p.b).push_back(m.targets[k]);
  }
  EXPECT_EQ(p.masked, std::max(1, static_cast<int>(std::lround(0.15 * n))));
  return p;
}

TEST(BertDataset, SamplesAreSentencePairsOfTheDocuments) {
  const auto c = corpus(50, 1);
  const int S = 32;
  const BertDataset train(c, Split::kTrain, 0.1, S, 7, options(), 60);
  EXPECT_EQ(train.documents(), 45);
  int random_next = 0;
  for (uint64_t s = 0; s < 400; ++s) {
    MaskedLmSample m;
    train.read_sample(s, &m);
    const Parsed p = parse(m, S);
    EXPECT_EQ(train.masked_tokens(s), p.masked);
    std::vector<int32_t> ab = p.a;
    ab.insert(ab.end(), p.b.begin(), p.b.end());
    if (m.sentence_label == 0) {
      // Next: A and B are one run of one train document.
      EXPECT_TRUE(in_a_document(*c, ab, 0, 45)) << "sample " << s;
    } else {
      ++random_next;
      EXPECT_TRUE(in_a_document(*c, p.a, 0, 45)) << "sample " << s;
      EXPECT_TRUE(in_a_document(*c, p.b, 0, 45)) << "sample " << s;
    }
  }
  EXPECT_GT(random_next, 150);
  EXPECT_LT(random_next, 250);
}

TEST(BertDataset, SentenceOrderSwapsTheHalvesOfAPiece) {
  const auto c = corpus(50, 2);
  const int S = 24;
  const BertDataset train(c, Split::kTrain, 0.1, S, 7, options(true), 60);
  int swapped = 0;
  for (uint64_t s = 0; s < 300; ++s) {
    MaskedLmSample m;
    train.read_sample(s, &m);
    const Parsed p = parse(m, S);
    std::vector<int32_t> in_order = m.sentence_label ? p.b : p.a;
    const std::vector<int32_t>& second = m.sentence_label ? p.a : p.b;
    in_order.insert(in_order.end(), second.begin(), second.end());
    EXPECT_TRUE(in_a_document(*c, in_order, 0, 45)) << "sample " << s;
    swapped += m.sentence_label;
  }
  EXPECT_GT(swapped, 110);
  EXPECT_LT(swapped, 190);
}

// The masking's proportions over many samples, each within 5 binomial standard deviations.
TEST(BertDataset, MaskingFollowsTheRecipe) {
  const auto c = corpus(400, 3);
  const int S = 64;
  const BertDataset train(c, Split::kTrain, 0.1, S, 11, options(), 60);
  int64_t predicted = 0, mask = 0, kept = 0, real = 0;
  for (uint64_t s = 0; s < 3000; ++s) {
    MaskedLmSample m;
    train.read_sample(s, &m);
    real += m.length;
    for (int i = 0; i < S; ++i) {
      const size_t k = static_cast<size_t>(i);
      if (m.loss_mask[k] == 0.0f) continue;
      ++predicted;
      mask += m.tokens[k] == kMask;
      kept += m.tokens[k] == m.targets[k];
      EXPECT_TRUE(m.tokens[k] == kMask || (m.tokens[k] >= 0 && m.tokens[k] < 60));
    }
  }
  const auto within = [](double got, double p, double n) {
    return std::fabs(got - p * n) <= 5 * std::sqrt(n * p * (1 - p));
  };
  const double random = static_cast<double>(predicted - mask - kept);
  EXPECT_TRUE(within(static_cast<double>(mask), 0.8, static_cast<double>(predicted)))
      << mask << " of " << predicted;
  // Kept: 10%, plus the random draws that happen to equal the original token (1/56 of 10%).
  EXPECT_TRUE(within(static_cast<double>(kept), 0.1 + 0.1 / 56, static_cast<double>(predicted)))
      << kept << " of " << predicted;
  EXPECT_TRUE(within(random, 0.1 - 0.1 / 56, static_cast<double>(predicted)))
      << random << " of " << predicted;
  EXPECT_NEAR(static_cast<double>(predicted) / static_cast<double>(real), 0.15, 0.02);
  std::printf(
      "%lld positions predicted of %lld real tokens (%.3f): [MASK] %.3f, kept %.3f, "
      "random %.3f\n",
      static_cast<long long>(predicted), static_cast<long long>(real),
      static_cast<double>(predicted) / static_cast<double>(real),
      static_cast<double>(mask) / static_cast<double>(predicted),
      static_cast<double>(kept) / static_cast<double>(predicted),
      random / static_cast<double>(predicted));
}

// short_seq_prob: a sample is cut below its piece's length with that probability (a target
// length uniform in [2, L]); with 0 every sample is its whole piece.
TEST(BertDataset, ShortSamplesAtTheirRate) {
  std::vector<int32_t> tokens(200 * 61);  // 200 documents of exactly one whole piece (L = 61)
  std::vector<int64_t> start;
  for (int d = 0; d <= 200; ++d) start.push_back(int64_t{d} * 61);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 60);
  const auto c = std::make_shared<MemoryCorpus>("pieces", std::move(tokens), std::move(start));
  for (double rate : {0.0, 0.1, 0.5}) {
    MaskedLmOptions o = options();
    o.short_seq_prob = rate;
    const BertDataset train(c, Split::kTrain, 0.1, 64, 5, o, 60);
    int shorter = 0;
    const int n = 2000;
    for (uint64_t s = 0; s < static_cast<uint64_t>(n); ++s) {
      MaskedLmSample m;
      train.read_sample(s, &m);
      shorter += m.length < 64;
    }
    // A target drawn uniformly in [2, 61] is below 61 with probability 59/60.
    const double p = rate * 59.0 / 60.0;
    EXPECT_LE(std::fabs(shorter - p * n), 5 * std::sqrt(n * p * (1 - p)) + 1e-9)
        << "rate " << rate << ": " << shorter << " of " << n;
  }
}

TEST(BertDataset, APureFunctionOfSeedAndSample) {
  const auto c = corpus(60, 4);
  const BertDataset a(c, Split::kTrain, 0.1, 32, 99, options(), 60);
  const BertDataset b(c, Split::kTrain, 0.1, 32, 99, options(), 60);
  const BertDataset other(c, Split::kTrain, 0.1, 32, 100, options(), 60);
  int differ = 0;
  for (uint64_t s : {0ull, 5ull, 77ull, 1000ull, 123456ull}) {
    MaskedLmSample x, y, z;
    b.read_sample(s, &y);  // read in another order than a
    a.read_sample(s, &x);
    other.read_sample(s, &z);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_EQ(x.loss_mask, y.loss_mask);
    EXPECT_EQ(x.sentence_label, y.sentence_label);
    differ += x.tokens != z.tokens;
  }
  EXPECT_GE(differ, 4);
  // An epoch visits every piece once: the pieces' first tokens of epoch 0 cover them all.
  EXPECT_GT(a.samples_per_epoch(), 0);
}

TEST(BertDataset, RefusesWhatCannotMakeASample) {
  const auto c = corpus(10, 5);
  EXPECT_THROW(BertDataset(c, Split::kTrain, 0.1, 7, 1, options(), 60), InputError);
  const auto one = std::make_shared<MemoryCorpus>("one", std::vector<int32_t>{1, 2, 3},
                                                  std::vector<int64_t>{0, 3});
  EXPECT_THROW(BertDataset(one, Split::kTrain, 0.1, 16, 1, options(), 60), InputError);
  // A token at the special ids' place is refused as it is read.
  const auto bad = std::make_shared<MemoryCorpus>(
      "bad", std::vector<int32_t>{1, 2, 61, 4, 5, 6, 1, 2}, std::vector<int64_t>{0, 6, 8});
  const BertDataset d(bad, Split::kTrain, 0.5, 16, 1, options(), 60);
  MaskedLmSample m;
  EXPECT_THROW(d.read_sample(0, &m), InputError);
}

class MaskedLmSource : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_mlm_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static SamplingShape shape(int seq_len, int global, int vocab) {
    SamplingShape s;
    s.seq_len = seq_len;
    s.global_batch = global;
    s.model_vocab = vocab;
    s.masked_lm = true;
    return s;
  }

  // Slots [0, B) of iteration `iter` drawn whole and in slices of 3 are the same, and
  // loss_tokens counts their loss mask.
  static void expect_layout_independent(const DataSource& d, int B, int S) {
    ASSERT_TRUE(d.masked_lm());
    for (uint64_t iter : {0ull, 3ull}) {
      SampleBatch whole;
      d.sample_batch(Split::kTrain, iter, 0, B, S, &whole);
      double counted = 0;
      for (float w : whole.loss_mask) counted += w;
      EXPECT_EQ(d.loss_tokens(Split::kTrain, iter, 0, B, S), counted);
      for (int first = 0; first < B; first += 3) {
        const int n = std::min(3, B - first);
        SampleBatch part;
        d.sample_batch(Split::kTrain, iter, first, n, S, &part);
        const auto at = static_cast<int64_t>(first) * S;
        EXPECT_TRUE(std::equal(part.inputs.begin(), part.inputs.end(), whole.inputs.begin() + at));
        EXPECT_TRUE(
            std::equal(part.loss_mask.begin(), part.loss_mask.end(), whole.loss_mask.begin() + at));
        EXPECT_TRUE(std::equal(part.sentence_labels.begin(), part.sentence_labels.end(),
                               whole.sentence_labels.begin() + first));
        EXPECT_EQ(d.loss_tokens(Split::kTrain, iter, first, n, S),
                  std::accumulate(part.loss_mask.begin(), part.loss_mask.end(), 0.0));
      }
    }
  }

  fs::path dir_;
};

TEST_F(MaskedLmSource, SyntheticDocuments) {
  DataConfig d;
  d.synthetic.vocab_size = 32;
  const auto src = make_data_source(d, 5, shape(24, 10, 100), "cfg.json");
  EXPECT_NE(src->describe().find("[CLS] 96 [SEP] 97 [MASK] 98 [PAD] 99"), std::string::npos)
      << src->describe();
  expect_layout_independent(*src, 10, 24);
}

TEST_F(MaskedLmSource, TextParagraphs) {
  const std::string path = (dir_ / "t.txt").string();
  std::ofstream(path) << "First paragraph,\nits second line.\n\n\nSecond one\nhere.\n\r\n"
                         "A third paragraph of some length to cut.\nAnd more of it.\n\nLast.\n";
  DataConfig d;
  d.source = "text";
  d.path = path;
  d.val_fraction = 0.25;
  const auto src = make_data_source(d, 5, shape(16, 6, 260), "cfg.json");
  EXPECT_NE(src->describe().find("4 documents"), std::string::npos) << src->describe();
  expect_layout_independent(*src, 6, 16);
  // Bytes need four more ids for the special tokens.
  EXPECT_THROW(make_data_source(d, 5, shape(16, 6, 259), "cfg.json"), InputError);
}

TEST_F(MaskedLmSource, IndexedDatasetWithSpecialIds) {
  const std::string prefix = (dir_ / "ix").string();
  {
    IndexedDatasetWriter w(prefix, 2);
    std::mt19937 rng(3);
    for (int doc = 0; doc < 40; ++doc) {
      std::vector<int32_t> t(10 + rng() % 50);
      for (int32_t& x : t) x = 4 + static_cast<int32_t>(rng() % 90);  // ids 0-3 are special
      w.add_document(t.data(), static_cast<int64_t>(t.size()));
    }
    w.finish();
  }
  DataConfig d;
  d.source = "indexed";
  d.path = prefix;
  d.masked_lm.cls_id = 0;
  d.masked_lm.sep_id = 1;
  d.masked_lm.mask_id = 2;
  d.masked_lm.pad_id = 3;
  const auto src = make_data_source(d, 5, shape(32, 8, 100), "cfg.json");
  expect_layout_independent(*src, 8, 32);
  SampleBatch b;
  src->sample_batch(Split::kVal, 0, 0, 8, 32, &b);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(b.inputs[static_cast<size_t>(r) * 32], 0);  // [CLS]
    const int n = b.lengths[static_cast<size_t>(r)];
    for (int i = n; i < 32; ++i) EXPECT_EQ(b.inputs[static_cast<size_t>(r * 32 + i)], 3);
  }
  // Some but not all ids, an id beyond the vocabulary, one id twice: refused at their key.
  const auto key_of = [&](const DataConfig& bad) {
    try {
      make_data_source(bad, 5, shape(32, 8, 100), "cfg.json");
    } catch (const InputError& e) {
      return e.where();
    }
    return std::string("accepted");
  };
  DataConfig partial = d;
  partial.masked_lm.pad_id.reset();
  EXPECT_EQ(key_of(partial), "data.masked_lm");
  DataConfig beyond = d;
  beyond.masked_lm.pad_id = 100;
  EXPECT_EQ(key_of(beyond), "data.masked_lm.pad_id");
  DataConfig twice = d;
  twice.masked_lm.sep_id = 0;
  EXPECT_EQ(key_of(twice), "data.masked_lm.sep_id");
}

}  // namespace
}  // namespace strata
