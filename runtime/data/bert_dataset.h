// bert_dataset.h — masked-LM samples from tokenized documents, as Megatron-LM's BERT dataset
// (and Google's create_pretraining_data) builds them.
//
// BertDataset: the documents of one TokenCorpus split into train and validation by document (the
// last val_fraction of them, at least one, as the GPT dataset splits), each document cut into
// pieces of at most L = seq_len − 3 tokens (⌈length / L⌉ near-equal pieces; a document of fewer
// than 2 tokens gives none). A piece is one sample per epoch; the pieces are visited in a
// shuffled order per epoch (a keyed bijection of (seed, split, epoch), as the GPT dataset's), so
// sample s is piece π_e(s mod n) of epoch e = s div n, n the pieces of the split. Every random
// decision of sample s is a word of a stream keyed by (seed, split, s), taken in this order:
//   1. with probability short_seq_prob the piece is cut to a target length drawn uniformly in
//      [2, L] (Megatron's short sequences), else kept whole: p tokens;
//   2. segment A is its first a tokens, a uniform in [1, p − 1];
//   3. the sentence task: next-sentence prediction — with probability 1/2 segment B is p − a
//      tokens at a uniform place in another document of the split (label 1, "random"; up to 10
//      draws for a document other than this one and long enough, else the piece's own rest and
//      label 0), else the piece's rest (label 0); or, with sentence_order, the piece's rest
//      with A and B swapped with probability 1/2 (label 1, ALBERT's sentence order);
//   4. the sequence [CLS] A [SEP] B [SEP] (n = p + 3 ≤ seq_len tokens, token types 0 up to and
//      with the first [SEP], 1 after), padded with [PAD] (type 0) to seq_len;
//   5. k = min(p, max(1, round(mask_prob · n))) of the p segment positions (Megatron's count,
//      whose cap mask_prob · seq_len n ≤ seq_len never reaches) are chosen (a partial
//      Fisher–Yates shuffle) to be predicted: each is
//      replaced by [MASK] with probability 0.8, kept with 0.1, and with 0.1 replaced by a token
//      drawn uniformly from [0, random_vocab) other than the special ones. Their targets are
//      the original tokens; the loss counts exactly them (loss mask 1).
// Segments are cut at any token (the corpora carry no sentence boundaries: Megatron's indexed
// datasets prepared with --split-sentences join their sentences into the document here).
// A sample is a pure function of (seed, split, s): every layout and a resumed run see the same
// samples. Its length — and so the number of masked tokens, what the loss averages over — is
// known from its plan alone, which reads document lengths but no tokens (masked_tokens()).
// Memory: a prefix sum of the pieces per document, 8 bytes per document; the tokens stay in
// the corpus's mapped file.
//
// Thread-safety: const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/data/corpus.h"
#include "runtime/data/data_source.h"

namespace strata {

// The special tokens and the masking recipe (runtime/base/config.h's MaskedLmDataConfig, resolved).
struct MaskedLmOptions {
  int32_t cls = 0, sep = 0, mask = 0, pad = 0;
  // Random replacements are drawn from [0, random_vocab), the special tokens excluded.
  int64_t random_vocab = 0;
  double mask_prob = 0.15;
  double short_seq_prob = 0.1;
  bool sentence_order = false;
};

// One sample, seq_len long.
struct MaskedLmSample {
  std::vector<int32_t> tokens, targets, token_types;
  std::vector<float> loss_mask;
  int32_t length = 0;          // real tokens
  int32_t sentence_label = 0;  // 1: random next (NSP) or swapped (SOP)
};

class BertDataset {
 public:
  // vocab_limit: document tokens must be below it (0: unchecked), an InputError naming the file
  // and byte otherwise. Throws InputError when seq_len < 8 (a piece must split into two
  // segments of some length) or the split has no piece.
  BertDataset(std::shared_ptr<const TokenCorpus> corpus, Split split, double val_fraction,
              int seq_len, uint64_t seed, const MaskedLmOptions& options, int64_t vocab_limit);

  int64_t documents() const { return last_doc_ - first_doc_; }
  int64_t samples_per_epoch() const { return pieces_.back(); }
  // Sample s of the stream.
  void read_sample(uint64_t s, MaskedLmSample* out) const;
  // The positions sample s predicts (its loss counts them), from its plan alone.
  int masked_tokens(uint64_t s) const;

 private:
  // Where a sample's segments come from, and its label.
  struct Plan {
    int64_t doc = 0, begin = 0;       // the piece: document, first token
    int64_t p = 0;                    // tokens of A and B together
    int64_t a = 0;                    // tokens of A
    int64_t b_doc = -1, b_begin = 0;  // B from another document (NSP "random"), else -1
    bool swapped = false;             // SOP: B then A
    int32_t label = 0;
    uint64_t key = 0;        // the sample's stream
    uint64_t next_word = 0;  // the first word the masking draws
  };
  Plan plan(uint64_t s) const;
  int to_predict(int64_t n) const;
  void read_checked(int64_t doc, int64_t offset, int64_t count, int32_t* out) const;

  std::shared_ptr<const TokenCorpus> corpus_;
  Split split_;
  int seq_len_;
  uint64_t seed_;
  MaskedLmOptions o_;
  int64_t vocab_limit_;
  int64_t first_doc_ = 0, last_doc_ = 0;  // the split's documents [first, last)
  std::vector<int64_t> pieces_;           // [k] pieces of the split's documents before k; [D] all
};

}  // namespace strata
