// commands/inference.h — a trained model loaded to run, not to train: what `strata generate` and
// `strata eval` share.
//
// The model comes from a Strata checkpoint (the model keys its run_state.json recorded; a
// checkpoint.dir selects its newest valid checkpoint) or from a Hugging Face directory
// (config.json through the architecture's adapter). The config file and --set overrides give the
// rest: parallel.tensor (the world is tensor × data ranks; the pipeline is 1 and sequence
// parallelism off: every rank holds every layer of its tensor shard), device, train.precision,
// train.threads and data.* (the tokenizer for text; `strata eval`'s dataset).
//
// Thread-safety: one session per process, used from one thread; construction is collective
// under mpirun.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/args.h"
#include "launch/train/run_layout.h"
#include "models/model.h"
#include "runtime/backend/backend.h"
#include "runtime/base/config.h"
#include "runtime/comm/process_groups.h"
#include "runtime/data/tokenizer.h"

namespace strata {

struct InferenceSource {
  std::optional<std::string> checkpoint;  // a Strata checkpoint (or checkpoint.dir)
  std::optional<std::string> hf;          // a Hugging Face directory
  std::string config;                     // a config file ("": none)
  std::vector<std::string> sets;          // --set overrides
  // The data section is the checkpoint's run's (its run_state.json records it) rather than the
  // config's: strata eval --data with neither --config nor a data.* --set.
  bool data_of_run = false;
};

// The model-source flags (--checkpoint, --hf, --config, --set) reading into `s`, for a command's
// flag table (launch/args.h).
std::vector<Flag> source_flags(InferenceSource* s);

class InferenceSession {
 public:
  // Throws InputError for a bad source, config or checkpoint.
  explicit InferenceSession(const InferenceSource& source);
  InferenceSession(const InferenceSession&) = delete;  // run_ points at cfg_
  InferenceSession& operator=(const InferenceSession&) = delete;

  const Config& config() const { return cfg_; }
  const ModelConfig& model_config() const { return cfg_.model; }
  Model& model() { return *model_; }
  Backend& backend() { return *be_; }
  const ProcessGroups& groups() const { return groups_; }
  // data.tokenizer's, or null (a byte model reads text as bytes: is_byte_model()).
  const Tokenizer* tokenizer() const { return tok_.get(); }
  bool is_byte_model() const {
    return cfg_.model.vocab_size >= 256 && cfg_.model.vocab_size <= 257;
  }
  // Text as token ids (the tokenizer, or bytes); InputError naming `what` when neither applies.
  std::vector<int32_t> encode(const std::string& text, const std::string& what) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // "" without either

 private:
  Config cfg_;
  RunLayout run_;
  std::unique_ptr<Backend> be_;
  ProcessGroups groups_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace strata
