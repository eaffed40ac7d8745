// data.h — training data sources and deterministic sampling.
//
// A DataSource produces sequences of seq_len + 1 tokens (inputs and next-token targets) for a
// split (train or validation). Which sequence a slot of a batch gets depends only on
// (seed, split, iteration, index of the sequence in the global batch), never on how the run
// is parallelised: a rank computing sequences [first, first + count) of iteration `iter` gets
// exactly what a single process gets for those slots.
//
// Sources (data.source):
//   synthetic — sequences from a seeded random Markov chain of order data.synthetic.order over
//               data.synthetic.vocab_size tokens. Each sequence starts in the chain's stationary
//               distribution, so its exact entropy rate (nats/token) is the best achievable mean
//               loss at positions with a full context; loss_floor() adds the positions whose
//               context is shorter than the order.
//   text      — any UTF-8 file as byte tokens (vocabulary 256), or tokenized with data.tokenizer
//               (byte-level BPE; the tokenizer's vocabulary).
//   tokens, indexed — tokenized datasets (llm.c token shards, Megatron's indexed .idx/.bin),
//               memory-mapped, one or a data.blend of several, sampled as Megatron's GPT dataset
//               (runtime/data/corpus_source.h, runtime/data/gpt_dataset.h).
// For text the last val_fraction of the file is the validation split; for datasets the last
// val_fraction of the documents.
//
// Masked language modelling (an encoder: model.arch "bert", SamplingShape::masked_lm): every
// source's documents become BERT's samples instead (runtime/data/masked_lm_source.h): sentence
// pairs [CLS] A [SEP] B [SEP] with token types, padding and masked positions, and a sentence
// label per sequence (SampleBatch's masked-LM fields). Documents: the dataset's for tokens and
// indexed, the text's paragraphs (blank-line separated), the synthetic chain's generated
// documents.
//
// Errors in data files (missing, truncated, wrong magic/version, invalid UTF-8, too short for
// one sequence) throw InputError naming the file and the byte offset.
//
// Thread-safety: sample() is const and may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/config.h"

namespace strata {

enum class Split { kTrain = 0, kVal = 1 };

// Sequences [first, first + count) of a batch as a source writes them, on the host.
struct SampleBatch {
  std::vector<int32_t> inputs, targets;  // (count, seq_len)
  // A masked-LM source's (DataSource::masked_lm()), empty for the others:
  std::vector<int32_t> token_types;      // (count, seq_len): segment A 0, B 1, padding 0
  std::vector<float> loss_mask;          // (count, seq_len): 1 at the positions to predict
  std::vector<int32_t> lengths;          // (count): real tokens; [length, seq_len) is padding
  std::vector<int32_t> sentence_labels;  // (count): 1 = B is not A's next (NSP) / swapped (SOP)
};

class DataSource {
 public:
  virtual ~DataSource() = default;

  // Number of distinct token ids (tokens are in [0, vocab_size)).
  virtual int vocab_size() const = 0;
  // One line describing the source for the start-up log.
  virtual std::string describe() const = 0;
  // Exact entropy rate in nats/token, when known (synthetic only).
  virtual std::optional<double> entropy_rate() const { return std::nullopt; }
  // Best achievable mean loss over the positions of a sequence of seq_len inputs (synthetic
  // only): positions with fewer than `order` tokens of context cost more than the rate.
  virtual std::optional<double> loss_floor(int seq_len) const { return std::nullopt; }

  // Writes sequences [first, first + count) of batch `iter` of `split`:
  // inputs (count, seq_len) and targets (count, seq_len), targets[i] = the token after inputs[i].
  // A pure function of its arguments, safe to call from any thread: the trainer samples the
  // next micro-batch on a host thread while the device computes.
  virtual void sample(Split split, uint64_t iter, int64_t first, int count, int seq_len,
                      int32_t* inputs, int32_t* targets) const = 0;
  // The same sequences with every field the source has (sample()'s inputs and targets, and a
  // masked-LM source's token types, loss mask, lengths and sentence labels), sized here.
  virtual void sample_batch(Split split, uint64_t iter, int64_t first, int count, int seq_len,
                            SampleBatch* out) const;
  // Whether sample_batch fills the masked-LM fields (an encoder's data).
  virtual bool masked_lm() const { return false; }
  // How many target positions of those sequences count in the loss — what the loss of a batch
  // averages over, known before any compute so that the backward can be scaled by its inverse.
  // A pure function like sample(). Language-model sources count every position; a source with
  // masked or padded positions counts fewer.
  virtual double loss_tokens(Split split, uint64_t iter, int64_t first, int count,
                             int seq_len) const {
    return static_cast<double>(count) * seq_len;
  }
};

// What sampling needs to know of the run besides the data keys.
struct SamplingShape {
  int seq_len = 0;
  // Sequences per iteration: tokenized datasets number the samples of a split's stream by
  // iteration · global_batch + index in the batch (runtime/data/corpus_source.h).
  int64_t global_batch = 1;
  // Token ids must be below it, checked as tokens are read (0: unchecked).
  int64_t model_vocab = 0;
  // The model is an encoder trained on masked-LM samples (models/registry.h's
  // ArchSpec::masked_lm): the source builds those from its documents.
  bool masked_lm = false;
};

// Builds the source of `data`, seeded by `seed` (train.seed) for sampling. `config_file` names
// the config in errors about data keys. Throws InputError.
std::unique_ptr<DataSource> make_data_source(const DataConfig& data, uint64_t seed,
                                             const SamplingShape& shape,
                                             const std::string& config_file);
// The same for a run of one sequence per iteration and no vocabulary check (tests, tools).
std::unique_ptr<DataSource> make_data_source(const DataConfig& data, uint64_t seed, int seq_len,
                                             const std::string& config_file);

}  // namespace strata
