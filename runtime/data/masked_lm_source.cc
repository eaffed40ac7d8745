#include "runtime/data/masked_lm_source.h"

#include <algorithm>
#include <set>

#include "runtime/base/check.h"
#include "runtime/base/error.h"
#include "runtime/data/bert_dataset.h"
#include "runtime/data/gpt_dataset.h"

namespace strata {
namespace {

class MaskedLmSource final : public DataSource {
 public:
  MaskedLmSource(std::vector<std::unique_ptr<BertDataset>> train,
                 std::vector<std::unique_ptr<BertDataset>> val, std::vector<double> weights,
                 int64_t global_batch, int vocab, std::string description)
      : train_(std::move(train)),
        val_(std::move(val)),
        train_blend_(weights),
        val_blend_(weights),
        global_batch_(global_batch),
        vocab_(vocab),
        description_(std::move(description)) {}

  int vocab_size() const override { return vocab_; }
  std::string describe() const override { return description_; }
  bool masked_lm() const override { return true; }

  void sample(Split split, uint64_t iter, int64_t first, int count, int seq_len, int32_t* inputs,
              int32_t* targets) const override {
    SampleBatch b;
    sample_batch(split, iter, first, count, seq_len, &b);
    std::copy(b.inputs.begin(), b.inputs.end(), inputs);
    std::copy(b.targets.begin(), b.targets.end(), targets);
  }

  void sample_batch(Split split, uint64_t iter, int64_t first, int count, int seq_len,
                    SampleBatch* out) const override {
    const size_t n = static_cast<size_t>(count) * static_cast<size_t>(seq_len);
    out->inputs.resize(n);
    out->targets.resize(n);
    out->token_types.resize(n);
    out->loss_mask.resize(n);
    out->lengths.resize(static_cast<size_t>(count));
    out->sentence_labels.resize(static_cast<size_t>(count));
    MaskedLmSample m;
    for (int r = 0; r < count; ++r) {
      const auto [set, i] = assign(split, iter, first + r);
      set->read_sample(i, &m);
      STRATA_CHECK(static_cast<int>(m.tokens.size()) == seq_len,
                   "masked-LM sample of " << m.tokens.size() << " tokens for seq_len " << seq_len);
      const size_t at = static_cast<size_t>(r) * static_cast<size_t>(seq_len);
      std::copy(m.tokens.begin(), m.tokens.end(), out->inputs.begin() + at);
      std::copy(m.targets.begin(), m.targets.end(), out->targets.begin() + at);
      std::copy(m.token_types.begin(), m.token_types.end(), out->token_types.begin() + at);
      std::copy(m.loss_mask.begin(), m.loss_mask.end(), out->loss_mask.begin() + at);
      out->lengths[static_cast<size_t>(r)] = m.length;
      out->sentence_labels[static_cast<size_t>(r)] = m.sentence_label;
    }
  }

  double loss_tokens(Split split, uint64_t iter, int64_t first, int count,
                     int /*seq_len*/) const override {
    double tokens = 0;
    for (int r = 0; r < count; ++r) {
      const auto [set, i] = assign(split, iter, first + r);
      tokens += set->masked_tokens(i);
    }
    return tokens;
  }

 private:
  // The dataset of slot g of iteration iter, and the sample's index in its stream.
  std::pair<const BertDataset*, uint64_t> assign(Split split, uint64_t iter, int64_t g) const {
    const auto& sets = split == Split::kTrain ? train_ : val_;
    const Blend& blend = split == Split::kTrain ? train_blend_ : val_blend_;
    const uint64_t s = iter * static_cast<uint64_t>(global_batch_) + static_cast<uint64_t>(g);
    const auto [d, i] = sets.size() == 1 ? std::pair<int, uint64_t>{0, s} : blend.assign(s);
    return {sets[static_cast<size_t>(d)].get(), i};
  }

  std::vector<std::unique_ptr<BertDataset>> train_, val_;
  Blend train_blend_, val_blend_;
  int64_t global_batch_;
  int vocab_;
  std::string description_;
};

// The special tokens and the random replacements' vocabulary from the config; the bound every
// document token must stay below.
struct Specials {
  MaskedLmOptions options;
  int64_t vocab_limit = 0;
};

Specials resolve_specials(const MaskedLmDataConfig& c, int64_t V, int64_t data_vocab,
                          const std::string& config_file) {
  Specials s;
  MaskedLmOptions& o = s.options;
  o.mask_prob = c.mask_prob;
  o.short_seq_prob = c.short_seq_prob;
  o.sentence_order = c.sentence_order;
  const int given = !!c.cls_id + !!c.sep_id + !!c.mask_id + !!c.pad_id;
  if (given != 0 && given != 4)
    throw InputError(config_file, "data.masked_lm",
                     "all four of cls_id, sep_id, mask_id and pad_id, or none (the last four ids "
                     "of model.vocab_size), got " +
                         std::to_string(given));
  if (given == 0) {
    if (V < 5 || (data_vocab > 0 && data_vocab > V - 4))
      throw InputError(config_file, "model.vocab_size",
                       "at least the data's vocabulary " + std::to_string(data_vocab) +
                           " + 4 special tokens ([CLS], [SEP], [MASK], [PAD] take the last four "
                           "ids) = " +
                           std::to_string(std::max<int64_t>(data_vocab, 1) + 4) + ", got " +
                           std::to_string(V));
    o.cls = static_cast<int32_t>(V - 4);
    o.sep = static_cast<int32_t>(V - 3);
    o.mask = static_cast<int32_t>(V - 2);
    o.pad = static_cast<int32_t>(V - 1);
    s.vocab_limit = V - 4;
  } else {
    const std::pair<const char*, int> ids[] = {{"cls_id", *c.cls_id},
                                               {"sep_id", *c.sep_id},
                                               {"mask_id", *c.mask_id},
                                               {"pad_id", *c.pad_id}};
    std::set<int> seen;
    for (const auto& [key, id] : ids) {
      if (id >= V)
        throw InputError(
            config_file, std::string("data.masked_lm.") + key,
            "an id below model.vocab_size " + std::to_string(V) + ", got " + std::to_string(id));
      if (!seen.insert(id).second)
        throw InputError(config_file, std::string("data.masked_lm.") + key,
                         "four distinct special token ids, got " + std::to_string(id) + " twice");
    }
    o.cls = *c.cls_id;
    o.sep = *c.sep_id;
    o.mask = *c.mask_id;
    o.pad = *c.pad_id;
    s.vocab_limit = V;
  }
  o.random_vocab = data_vocab > 0 ? data_vocab : s.vocab_limit;
  int inside = 0;  // special ids a random draw could hit
  for (int32_t id : {o.cls, o.sep, o.mask, o.pad}) inside += id < o.random_vocab;
  if (o.random_vocab <= inside)
    throw InputError(config_file, "data.masked_lm",
                     "a vocabulary with tokens besides the special ones for random replacements, "
                     "got " +
                         std::to_string(o.random_vocab) + " ids");
  return s;
}

}  // namespace

std::unique_ptr<DataSource> make_masked_lm_source(const std::vector<MaskedLmCorpus>& corpora,
                                                  const DataConfig& data, uint64_t seed,
                                                  const SamplingShape& shape,
                                                  const std::string& description,
                                                  const std::string& config_file) {
  if (corpora.empty() || shape.model_vocab <= 0)
    throw std::invalid_argument("make_masked_lm_source: corpora and the model's vocabulary");
  int64_t data_vocab = 0;  // the largest known, 0 when one is unknown
  bool known = true;
  for (const MaskedLmCorpus& c : corpora) {
    known = known && c.vocab > 0;
    data_vocab = std::max(data_vocab, c.vocab);
  }
  if (!known) data_vocab = 0;
  const Specials sp = resolve_specials(data.masked_lm, shape.model_vocab, data_vocab, config_file);
  std::vector<std::unique_ptr<BertDataset>> train, val;
  std::vector<double> weights;
  int64_t documents = 0;
  for (const MaskedLmCorpus& c : corpora) {
    train.push_back(std::make_unique<BertDataset>(c.corpus, Split::kTrain, data.val_fraction,
                                                  shape.seq_len, seed, sp.options, sp.vocab_limit));
    val.push_back(std::make_unique<BertDataset>(c.corpus, Split::kVal, data.val_fraction,
                                                shape.seq_len, seed, sp.options, sp.vocab_limit));
    weights.push_back(c.weight);
    documents += c.corpus->num_documents();
  }
  const MaskedLmOptions& o = sp.options;
  int64_t samples = 0;
  for (const auto& t : train) samples += t->samples_per_epoch();
  const std::string text = description + ": masked LM, " + std::to_string(documents) +
                           " documents, " + std::to_string(samples) + " train samples per epoch; " +
                           (o.sentence_order ? "sentence order" : "next sentence") + ", mask " +
                           std::to_string(o.mask_prob).substr(0, 4) + ", [CLS] " +
                           std::to_string(o.cls) + " [SEP] " + std::to_string(o.sep) + " [MASK] " +
                           std::to_string(o.mask) + " [PAD] " + std::to_string(o.pad);
  const int vocab =
      static_cast<int>(std::max<int64_t>({data_vocab, int64_t{o.cls} + 1, int64_t{o.sep} + 1,
                                          int64_t{o.mask} + 1, int64_t{o.pad} + 1}));
  return std::make_unique<MaskedLmSource>(std::move(train), std::move(val), std::move(weights),
                                          shape.global_batch, vocab, text);
}

MemoryCorpus::MemoryCorpus(std::string path, std::vector<int32_t> tokens,
                           std::vector<int64_t> start)
    : path_(std::move(path)), tokens_(std::move(tokens)), start_(std::move(start)) {
  STRATA_CHECK(!start_.empty() && start_.back() == static_cast<int64_t>(tokens_.size()),
               "MemoryCorpus: document starts must end at the token count");
}

int64_t MemoryCorpus::document_length(int64_t d) const {
  return start_[static_cast<size_t>(d) + 1] - start_[static_cast<size_t>(d)];
}

void MemoryCorpus::read(int64_t d, int64_t offset, int64_t count, int32_t* out) const {
  std::copy_n(tokens_.begin() + start_[static_cast<size_t>(d)] + offset, count, out);
}

std::string MemoryCorpus::locate(int64_t d, int64_t offset) const {
  return path_ + ": document " + std::to_string(d) + " token " + std::to_string(offset);
}

}  // namespace strata
