// checkpointing.h — the run's checkpoints: resume from one (saved under any layout), start from
// a Hugging Face file (model.init_from), and save every checkpoint.interval iterations
// (runtime/checkpoint.h: the crash-safe format; launch/train/model_state.h: shards ↔ full
// tensors; the architecture's Hugging Face adapter from models/registry.h).
//
// Thread-safety: driven from the training thread; restore() and save() are collective over the
// host group.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/run_layout.h"
#include "models/description.h"
#include "models/model.h"
#include "runtime/grad_reducer.h"
#include "runtime/optimizer.h"
#include "runtime/process_groups.h"

namespace strata {

// Where a run starts.
struct RunStart {
  int iteration = 0;           // iterations a resumed checkpoint had already done
  int nonfinite_in_a_row = 0;  // its count of consecutive skipped steps
  // PipeDream-2BW resuming at iteration k > 0: this rank's flat W(k−1), the version batch k runs
  // on (the checkpoint's param_prev; W(k) itself when it came from a flushing schedule).
  std::vector<float> previous_params;
};

class Checkpointing {
 public:
  // Refuses (InputError) checkpoint settings the run cannot honour.
  Checkpointing(const RunLayout& run, const ModelDescription& desc, ProcessGroups& groups,
                Model& model, AdamW& opt, GradReducer& reducer, Backend& be, bool lead);

  // Resumes from checkpoint.resume (a path, or the newest valid checkpoint of checkpoint.dir
  // with "auto"), else starts from model.init_from, else leaves the seed's initialisation.
  // Rank 0 chooses, so that every rank loads the same checkpoint. InputError for a checkpoint
  // or file that does not fit the config.
  RunStart restore();
  // Whether iteration `it` (1-based) ends with a save.
  bool due(int it) const;
  // Writes the checkpoint of iteration `it` from the model's parameters (2bw: the newest
  // version W(it)); previous: 2bw's W(it−1), saved beside them.
  void save(int it, int nonfinite_in_a_row, const Tensor* previous = nullptr);

 private:
  const RunLayout& run_;
  const ModelDescription& desc_;
  ProcessGroups& groups_;
  Model& model_;
  AdamW& opt_;
  GradReducer& reducer_;
  Backend& be_;
  bool lead_;
};

// The model keys that fix parameter shapes, as a checkpoint records them: it loads only into the
// same values.
nlohmann::json model_shape_json(const ModelConfig& m, const ModelDescription& desc);
// InputError(file, "model", …) naming every key of `want` whose value `saved` (read from `file`)
// does not have, with both values; `what` names where `want` came from ("config").
void check_model_shape(const nlohmann::json& want, const nlohmann::json& saved,
                       const std::string& file, const std::string& what);

}  // namespace strata
