// masked_lm_source.h — the DataSource of an encoder (model.arch "bert", SamplingShape::
// masked_lm): BERT's masked-LM samples (runtime/data/bert_dataset.h) over the documents of any
// data.source, blended by weight as the GPT datasets are (data.blend).
//
// Documents: a tokens or indexed dataset's own (runtime/data/corpus_source.h opens them), a text
// file's paragraphs (runs of lines between blank lines, as bytes or through data.tokenizer:
// MemoryCorpus), the synthetic chain's generated documents (runtime/data/data_source.cc).
//
// Sample index: sequence g of the global batch of iteration `iter` is sample iter·B + g of its
// split's stream (B = sequences per iteration), as the GPT datasets number them, so every layout
// sees the same global batches and a resumed run continues exactly. loss_tokens() counts the
// masked positions of the sequences asked for, from the samples' plans (no token is read).
//
// Special tokens (data.masked_lm.{cls,sep,mask,pad}_id): all four given (distinct, below
// model.vocab_size), or none: then the last four ids of model.vocab_size, [CLS] V−4, [SEP] V−3,
// [MASK] V−2, [PAD] V−1, and the data's tokens must lie below V−4 (a byte text needs
// model.vocab_size ≥ 260). Random replacements are drawn from the data's vocabulary where it is
// known (bytes, the tokenizer's, the synthetic chain's), else from [0, V−4) or [0, V).
//
// Thread-safety: sample() and sample_batch() may be called concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/base/config.h"
#include "runtime/data/corpus.h"
#include "runtime/data/data_source.h"

namespace strata {

// One corpus of the source and what sampling needs to know of it.
struct MaskedLmCorpus {
  std::shared_ptr<const TokenCorpus> corpus;
  double weight = 1;  // its share of a blend
  int64_t vocab = 0;  // its tokens lie below it; 0: unknown (checked against the model's)
};

// The source over `corpora` (at least one). `description` opens describe()'s line. Throws
// InputError (config_file and data.masked_lm.* or model.vocab_size for the special tokens; the
// corpus for too little data).
std::unique_ptr<DataSource> make_masked_lm_source(const std::vector<MaskedLmCorpus>& corpora,
                                                  const DataConfig& data, uint64_t seed,
                                                  const SamplingShape& shape,
                                                  const std::string& description,
                                                  const std::string& config_file);

// Documents held in memory: tokens back to back, start[d] the first of document d (start has
// documents + 1 entries, the last the total). `path` names it in messages.
class MemoryCorpus final : public TokenCorpus {
 public:
  MemoryCorpus(std::string path, std::vector<int32_t> tokens, std::vector<int64_t> start);

  std::string path() const override { return path_; }
  int64_t num_documents() const override { return static_cast<int64_t>(start_.size()) - 1; }
  int64_t document_length(int64_t d) const override;
  int64_t num_tokens() const override { return static_cast<int64_t>(tokens_.size()); }
  int token_bytes() const override { return 4; }
  void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const override;
  std::string locate(int64_t d, int64_t offset) const override;

 private:
  std::string path_;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> start_;
};

}  // namespace strata
