#include "runtime/data/gpt_dataset.h"

#include <algorithm>
#include <cmath>

#include "runtime/base/error.h"
#include "runtime/data/data_internal.h"

namespace strata {

uint64_t keyed_permutation(uint64_t x, uint64_t n, uint64_t key) {
  if (n <= 1) return x;
  int bits = 1;
  while ((uint64_t{1} << bits) < n) ++bits;
  const int half = (bits + 1) / 2;  // a balanced network over 2·half ≥ bits bits
  const uint64_t mask = (uint64_t{1} << half) - 1;
  // Cycle walking: re-apply the bijection of [0, 2^(2·half)) until the value falls in [0, n)
  // (the domain is below 4n, so a few rounds on average).
  do {
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = mix64(key ^ (round * 0x9E3779B97F4A7C15ull) ^ r) & mask;
      const uint64_t next_r = l ^ f;
      l = r;
      r = next_r;
    }
    x = (l << half) | r;
  } while (x >= n);
  return x;
}

namespace {

// The key of one shuffle: (seed, split, epoch, which of the two orders).
uint64_t shuffle_key(uint64_t seed, Split split, uint64_t epoch, uint64_t which) {
  return mix64(mix64(seed ^ 0x5EED0FDA7A5E7ull) ^ (static_cast<uint64_t>(split) << 62) ^
               (epoch << 1) ^ which);
}

}  // namespace

GptDataset::GptDataset(std::shared_ptr<const TokenCorpus> corpus, Split split, double val_fraction,
                       int seq_len, uint64_t seed, int64_t vocab_limit)
    : corpus_(std::move(corpus)),
      split_(split),
      seq_len_(seq_len),
      seed_(seed),
      vocab_limit_(vocab_limit) {
  const int64_t D = corpus_->num_documents();
  const std::string what = split == Split::kTrain ? "train" : "validation";
  // The validation split: the last val_fraction of the documents, at least one.
  int64_t val = static_cast<int64_t>(std::ceil(static_cast<double>(D) * val_fraction));
  val = std::max<int64_t>(val, val_fraction > 0 ? 1 : 0);
  if (D - val < 1) {
    throw InputError(corpus_->path(), "documents",
                     "at least 2 documents to split into train and validation (data.val_fraction " +
                         std::to_string(val_fraction) + "), found " + std::to_string(D));
  }
  first_doc_ = split == Split::kTrain ? 0 : D - val;
  last_doc_ = split == Split::kTrain ? D - val : D;
  for (int64_t d = first_doc_; d < last_doc_; ++d) tokens_ += corpus_->document_length(d);
  samples_ = tokens_ > 0 ? (tokens_ - 1) / seq_len : 0;
  if (samples_ < 1) {
    throw InputError(corpus_->path(), "documents",
                     "at least seq_len + 1 = " + std::to_string(seq_len + 1) + " tokens in the " +
                         what + " split (" + std::to_string(last_doc_ - first_doc_) +
                         " documents), found " + std::to_string(tokens_));
  }
}

std::shared_ptr<const GptDataset::Epoch> GptDataset::epoch(uint64_t e) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = epochs_.find(e);
    if (it != epochs_.end()) return it->second;
  }
  auto ep = std::make_shared<Epoch>();
  const uint64_t D = static_cast<uint64_t>(last_doc_ - first_doc_);
  const uint64_t key = shuffle_key(seed_, split_, e, 0);
  ep->order.resize(D);
  ep->start.resize(D + 1);
  int64_t at = 0;
  for (uint64_t k = 0; k < D; ++k) {
    const int64_t d = first_doc_ + static_cast<int64_t>(keyed_permutation(k, D, key));
    ep->order[k] = d;
    ep->start[k] = at;
    at += corpus_->document_length(d);
  }
  ep->start[D] = at;
  std::lock_guard<std::mutex> lock(mu_);
  epochs_[e] = ep;
  while (epochs_.size() > 2) {  // keep this epoch and one other (a batch across the boundary)
    auto victim = epochs_.begin();
    if (victim->first == e) ++victim;
    epochs_.erase(victim);
  }
  return ep;
}

void GptDataset::read_sample(uint64_t s, int32_t* tokens) const {
  const uint64_t n = static_cast<uint64_t>(samples_);
  const uint64_t e = s / n;
  const uint64_t j = keyed_permutation(s % n, n, shuffle_key(seed_, split_, e, 1));
  const std::shared_ptr<const Epoch> ep = epoch(e);
  int64_t pos = static_cast<int64_t>(j) * seq_len_;  // in the epoch's stream
  size_t k = static_cast<size_t>(std::upper_bound(ep->start.begin(), ep->start.end(), pos) -
                                 ep->start.begin() - 1);
  int64_t want = seq_len_ + 1;
  int32_t* out = tokens;
  while (want > 0) {
    const int64_t d = ep->order[k];
    const int64_t offset = pos - ep->start[k];
    const int64_t take = std::min(want, corpus_->document_length(d) - offset);
    if (take > 0) {
      corpus_->read(d, offset, take, out);
      if (vocab_limit_ > 0) {
        for (int64_t i = 0; i < take; ++i) {
          if (out[i] < 0 || out[i] >= vocab_limit_) {
            throw InputError(corpus_->locate(d, offset + i), "",
                             "token ids below the model's vocabulary " +
                                 std::to_string(vocab_limit_) + " (model.vocab_size), found " +
                                 std::to_string(out[i]));
          }
        }
      }
      out += take;
      want -= take;
      pos += take;
    }
    ++k;
  }
}

Blend::Blend(std::vector<double> weights) : weights_(std::move(weights)) {
  double sum = 0;
  for (double w : weights_) sum += w;
  for (double& w : weights_) w /= sum;
  taken_.assign(weights_.size(), 0);
}

std::pair<int, uint64_t> Blend::assign(uint64_t s) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (s < next_) {  // an earlier sample: start over
    next_ = 0;
    std::fill(taken_.begin(), taken_.end(), 0);
  }
  for (;;) {
    // Megatron's greedy rule (build_blending_indices): the dataset furthest behind its share,
    // the share measured at max(s, 1) samples.
    const double at = static_cast<double>(std::max<uint64_t>(next_, 1));
    int best = 0;
    double best_error = -1e300;
    for (size_t d = 0; d < weights_.size(); ++d) {
      const double error = weights_[d] * at - static_cast<double>(taken_[d]);
      if (error > best_error) {
        best_error = error;
        best = static_cast<int>(d);
      }
    }
    const uint64_t index = taken_[static_cast<size_t>(best)]++;
    if (next_++ == s) return {best, index};
  }
}

}  // namespace strata
