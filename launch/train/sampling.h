// sampling.h — log.sample_interval: a greedy sample every interval steps during training.
//
// The sample decodes log.sample_tokens new tokens after log.sample_prompt over the model's
// key/value caches, at any layout: tensor parallelism as in training (sequence parallelism is
// not used by decoding), the pieces of a pipeline one after another (decode_over_pipeline), each
// data-parallel replica on its own. It reads the parameters and nothing else: the data order, the
// losses and the updates of the run are those of the run without samples.
//
// PipeDream-2BW runs the whole training as one instruction list, so its steps are reported after
// the list ends: the sampler keeps a host copy of each sampled step's weights W(it) as the stage
// writes them (keep()) and decodes from it then — this rank's parameters once per sample taken in
// the run, in host memory.
//
// Thread-safety: the trainer's thread only. sample() is collective over the pipeline group.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "runtime/backend/backend.h"
#include "runtime/base/config.h"
#include "runtime/comm/comm.h"
#include "runtime/data/tokenizer.h"

namespace strata {

// A sample's new token ids and their text ("" without a tokenizer or byte model).
using TrainingSample = std::pair<std::vector<int32_t>, std::string>;

class TrainingSampler {
 public:
  // Loads data.tokenizer for text prompts; InputError for a prompt that cannot be read or that
  // does not fit in model.seq_len with the new tokens.
  TrainingSampler(const Config& cfg, Model& model, Backend& be, Communicator* pipeline);

  bool due(int iteration) const;
  // PipeDream-2BW: a host copy of W(iteration), the weights the stage just wrote, when a sample
  // of that iteration is due.
  void keep(int iteration, const Tensor& weights);
  // The sample of `iteration` from the current weights (or those keep() took), or nullopt when
  // none is due.
  std::optional<TrainingSample> sample(int iteration);

 private:
  const Config& cfg_;
  Model& model_;
  Backend& be_;
  Communicator* pipeline_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<int32_t> prompt_;
  std::map<int, std::vector<float>> kept_;  // [iteration] 2bw weights
};

}  // namespace strata
