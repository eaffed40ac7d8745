// gpt_dataset.h — training samples from tokenized documents, as Megatron-LM's GPTDataset and
// BlendedDataset draw them.
//
// GptDataset: the documents of one TokenCorpus split into train and validation by document (the
// last val_fraction of them, at least one, validate), concatenated in a shuffled order per epoch,
// cut into samples of seq_len + 1 tokens (consecutive samples share one token: the last target
// of one is the first input of the next) that cross document boundaries, visited in a shuffled
// order per epoch. Sample s of the stream is sample s mod n of epoch s div n (n samples per
// epoch = ⌊(tokens − 1) / seq_len⌋): no sample repeats within an epoch, and every epoch has its
// own document and sample order. Both shuffles are keyed bijections (a Feistel network with
// cycle walking) of (seed, split, epoch), so a sample is a pure function of (seed, s): nothing
// depends on the rank, the layout or what was read before, and a resumed run continues exactly.
// Memory: the document order and its token offsets for the epochs in use, O(documents); the
// tokens stay in the corpus's mapped file.
//
// Blend: several datasets by weight, Megatron's rule (build_blending_indices): sample s goes to
// the dataset furthest behind its share (argmax_d w_d·max(s, 1) − taken_d, the first on ties) and
// is that dataset's next sample. The assignment of s depends on s alone (and the weights); it is
// computed forward from the last one asked for (from 0 when asked for an earlier one), so a resumed
// run recomputes up to its first sample once.
//
// Thread-safety: read_sample() and assign() may be called concurrently (caches under a mutex).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/data/corpus.h"
#include "runtime/data/data_source.h"

namespace strata {

// A keyed bijection of [0, n): x ↦ its place in the shuffled order.
uint64_t keyed_permutation(uint64_t x, uint64_t n, uint64_t key);

class GptDataset {
 public:
  // vocab_limit: tokens must be below it (0: unchecked); a token at or above it is an
  // InputError naming the file and its byte offset. Throws InputError when the split has no
  // document or too few tokens for one sample.
  GptDataset(std::shared_ptr<const TokenCorpus> corpus, Split split, double val_fraction,
             int seq_len, uint64_t seed, int64_t vocab_limit);

  int64_t documents() const { return last_doc_ - first_doc_; }
  int64_t tokens_per_epoch() const { return tokens_; }
  int64_t samples_per_epoch() const { return samples_; }
  const TokenCorpus& corpus() const { return *corpus_; }
  // Sample s of the stream: seq_len + 1 tokens into `tokens`.
  void read_sample(uint64_t s, int32_t* tokens) const;

 private:
  struct Epoch {
    std::vector<int64_t> order;  // [k] the document at place k (corpus numbering)
    std::vector<int64_t> start;  // [k] its first token's offset in the epoch's stream; [D] = end
  };
  std::shared_ptr<const Epoch> epoch(uint64_t e) const;

  std::shared_ptr<const TokenCorpus> corpus_;
  Split split_;
  int seq_len_;
  uint64_t seed_;
  int64_t vocab_limit_;
  int64_t first_doc_ = 0, last_doc_ = 0;  // the split's documents [first, last)
  int64_t tokens_ = 0, samples_ = 0;
  mutable std::mutex mu_;
  mutable std::map<uint64_t, std::shared_ptr<const Epoch>> epochs_;  // the last two used
};

class Blend {
 public:
  // weights ≥ 0 with a positive sum (normalised here).
  explicit Blend(std::vector<double> weights);
  // The dataset of sample s and its index in that dataset's stream.
  std::pair<int, uint64_t> assign(uint64_t s) const;

 private:
  std::vector<double> weights_;
  mutable std::mutex mu_;
  mutable uint64_t next_ = 0;            // the sample the counts below lead up to
  mutable std::vector<uint64_t> taken_;  // [d] samples of d among [0, next_)
};

}  // namespace strata
