#include "runtime/data/bert_dataset.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/base/error.h"
#include "runtime/data/data_internal.h"
#include "runtime/data/gpt_dataset.h"

namespace strata {
namespace {

using data_internal::stream_word;
using data_internal::unit_double;

// The key of the piece order of an epoch, and of a sample's decisions.
uint64_t order_key(uint64_t seed, Split split, uint64_t epoch) {
  return mix64(mix64(seed ^ 0x4245525430524445ull) ^ (static_cast<uint64_t>(split) << 62) ^ epoch);
}
uint64_t sample_key(uint64_t seed, Split split, uint64_t s) {
  return mix64(mix64(mix64(seed ^ 0x42455254534D504Cull) ^ static_cast<uint64_t>(split)) ^ s);
}

// Pieces a document of `len` tokens is cut into (at most `L` tokens each).
int64_t pieces_of(int64_t len, int64_t L) {
  return len >= 2 ? (len + L - 1) / L : 0;
}

// Tries for a random-next document other than the sample's own (Google's create_pretraining
// data tries 10 times too).
constexpr int kRandomDocumentTries = 10;

}  // namespace

BertDataset::BertDataset(std::shared_ptr<const TokenCorpus> corpus, Split split,
                         double val_fraction, int seq_len, uint64_t seed,
                         const MaskedLmOptions& options, int64_t vocab_limit)
    : corpus_(std::move(corpus)),
      split_(split),
      seq_len_(seq_len),
      seed_(seed),
      o_(options),
      vocab_limit_(vocab_limit) {
  if (seq_len < 8)
    throw InputError(corpus_->path(), "",
                     "model.seq_len at least 8 for masked-LM samples ([CLS] A [SEP] B [SEP] with "
                     "segments of at least 2 tokens), got " +
                         std::to_string(seq_len));
  const int64_t D = corpus_->num_documents();
  const std::string what = split == Split::kTrain ? "train" : "validation";
  int64_t val = static_cast<int64_t>(std::ceil(static_cast<double>(D) * val_fraction));
  val = std::max<int64_t>(val, val_fraction > 0 ? 1 : 0);
  if (D - val < 1)
    throw InputError(corpus_->path(), "documents",
                     "at least 2 documents to split into train and validation (data.val_fraction " +
                         std::to_string(val_fraction) + "), found " + std::to_string(D));
  first_doc_ = split == Split::kTrain ? 0 : D - val;
  last_doc_ = split == Split::kTrain ? D - val : D;
  const int64_t L = seq_len_ - 3;
  pieces_.assign(static_cast<size_t>(last_doc_ - first_doc_ + 1), 0);
  for (int64_t d = first_doc_; d < last_doc_; ++d) {
    const size_t k = static_cast<size_t>(d - first_doc_);
    pieces_[k + 1] = pieces_[k] + pieces_of(corpus_->document_length(d), L);
  }
  if (pieces_.back() < 1)
    throw InputError(corpus_->path(), "documents",
                     "a document of at least 2 tokens in the " + what + " split (" +
                         std::to_string(last_doc_ - first_doc_) + " documents) for a sample");
}

BertDataset::Plan BertDataset::plan(uint64_t s) const {
  const uint64_t n = static_cast<uint64_t>(pieces_.back());
  const uint64_t j = keyed_permutation(s % n, n, order_key(seed_, split_, s / n));
  const size_t k = static_cast<size_t>(
      std::upper_bound(pieces_.begin(), pieces_.end(), static_cast<int64_t>(j)) - pieces_.begin() -
      1);
  Plan pl;
  pl.doc = first_doc_ + static_cast<int64_t>(k);
  const int64_t L = seq_len_ - 3, len = corpus_->document_length(pl.doc);
  const int64_t cuts = pieces_of(len, L), c = static_cast<int64_t>(j) - pieces_[k];
  pl.begin = c * len / cuts;
  pl.p = (c + 1) * len / cuts - pl.begin;
  pl.key = sample_key(seed_, split_, s);
  uint64_t w = 0;
  const auto word = [&]() { return stream_word(pl.key, w++); };
  // 1. A shorter sample now and then.
  if (unit_double(word()) < o_.short_seq_prob) {
    const int64_t target = 2 + static_cast<int64_t>(word() % static_cast<uint64_t>(L - 1));
    pl.p = std::min(pl.p, target);
  } else {
    word();  // the same words follow either way
  }
  // 2. The split between A and B.
  pl.a = 1 + static_cast<int64_t>(word() % static_cast<uint64_t>(pl.p - 1));
  // 3. The sentence task.
  const bool flip = unit_double(word()) < 0.5;
  if (o_.sentence_order) {
    pl.swapped = flip;
    pl.label = flip ? 1 : 0;
  } else if (flip) {
    const int64_t b_len = pl.p - pl.a, docs = last_doc_ - first_doc_;
    for (int t = 0; t < kRandomDocumentTries; ++t) {
      const int64_t d = first_doc_ + static_cast<int64_t>(word() % static_cast<uint64_t>(docs));
      const int64_t dl = corpus_->document_length(d);
      const uint64_t at = word();
      if (d == pl.doc || dl < b_len) continue;
      pl.b_doc = d;
      pl.b_begin = static_cast<int64_t>(at % static_cast<uint64_t>(dl - b_len + 1));
      pl.label = 1;
      break;
    }
  }
  pl.next_word = 1000;  // the masking's words, past any the plan can take
  return pl;
}

int BertDataset::to_predict(int64_t n) const {
  const int64_t k = std::max<int64_t>(1, std::llround(o_.mask_prob * static_cast<double>(n)));
  return static_cast<int>(std::min<int64_t>(k, n - 3));
}

int BertDataset::masked_tokens(uint64_t s) const {
  return to_predict(plan(s).p + 3);
}

void BertDataset::read_checked(int64_t doc, int64_t offset, int64_t count, int32_t* out) const {
  corpus_->read(doc, offset, count, out);
  if (vocab_limit_ <= 0) return;
  for (int64_t i = 0; i < count; ++i)
    if (out[i] < 0 || out[i] >= vocab_limit_)
      throw InputError(corpus_->locate(doc, offset + i), "",
                       "token ids below " + std::to_string(vocab_limit_) +
                           " (model.vocab_size, less the special tokens when they take its last "
                           "ids), found " +
                           std::to_string(out[i]));
}

void BertDataset::read_sample(uint64_t s, MaskedLmSample* out) const {
  const Plan pl = plan(s);
  const size_t S = static_cast<size_t>(seq_len_);
  const int64_t n = pl.p + 3;
  // The segments, in sequence order.
  std::vector<int32_t> a(static_cast<size_t>(pl.a)), b(static_cast<size_t>(pl.p - pl.a));
  read_checked(pl.doc, pl.begin, pl.a, a.data());
  if (pl.b_doc >= 0)
    read_checked(pl.b_doc, pl.b_begin, pl.p - pl.a, b.data());
  else
    read_checked(pl.doc, pl.begin + pl.a, pl.p - pl.a, b.data());
  if (pl.swapped) std::swap(a, b);

  MaskedLmSample& o = *out;
  o.tokens.assign(S, o_.pad);
  o.token_types.assign(S, 0);
  o.loss_mask.assign(S, 0.0f);
  size_t at = 0;
  o.tokens[at++] = o_.cls;
  for (int32_t t : a) o.tokens[at++] = t;
  o.tokens[at++] = o_.sep;
  for (int32_t t : b) {
    o.token_types[at] = 1;
    o.tokens[at++] = t;
  }
  o.token_types[at] = 1;
  o.tokens[at++] = o_.sep;
  o.targets = o.tokens;
  o.length = static_cast<int32_t>(n);
  o.sentence_label = pl.label;

  // The positions to predict: a partial Fisher–Yates shuffle of the segment positions.
  std::vector<int32_t> candidates;
  candidates.reserve(static_cast<size_t>(pl.p));
  for (int64_t i = 1; i < n - 1; ++i)
    if (i != static_cast<int64_t>(a.size()) + 1) candidates.push_back(static_cast<int32_t>(i));
  uint64_t w = pl.next_word;
  const auto word = [&]() { return stream_word(pl.key, w++); };
  const int k = to_predict(n);
  for (int i = 0; i < k; ++i) {
    const size_t left = candidates.size() - static_cast<size_t>(i);
    const size_t j = static_cast<size_t>(i) + static_cast<size_t>(word() % left);
    std::swap(candidates[static_cast<size_t>(i)], candidates[j]);
    const size_t pos = static_cast<size_t>(candidates[static_cast<size_t>(i)]);
    o.loss_mask[pos] = 1.0f;
    const double u = unit_double(word());
    if (u < 0.8) {
      o.tokens[pos] = o_.mask;
    } else if (u >= 0.9) {
      int32_t r;
      do {  // a token other than the special ones
        r = static_cast<int32_t>(word() % static_cast<uint64_t>(o_.random_vocab));
      } while (r == o_.cls || r == o_.sep || r == o_.mask || r == o_.pad);
      o.tokens[pos] = r;
    }
  }
}

}  // namespace strata
