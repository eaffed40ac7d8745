// checkpointing.h — the run's checkpoints: resume from one (saved under any layout), start from
// a Hugging Face file (model.init_from), and save every checkpoint.interval iterations
// (runtime/checkpoint/checkpoint.h: the crash-safe format; launch/train/model_state.h: shards ↔
// full tensors; the architecture's Hugging Face adapter from models/registry.h).
//
// Thread-safety: driven from the training thread; restore() and save() are collective over the
// host group.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/run_layout.h"
#include "models/description.h"
#include "models/model.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/dir_lock.h"
#include "runtime/comm/process_groups.h"
#include "runtime/engine/grad_reducer.h"
#include "runtime/engine/optimizer.h"

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
  // The first iteration after `after`, at most `last`, that ends with a save; `last` when none
  // does (where a 2bw instruction list has to stop).
  int next_save(int after, int last) const;
  // Saves the checkpoint of iteration `it` from the model's parameters (2bw: the newest version
  // W(it)); previous: 2bw's W(it−1), saved beside them. Collective. With checkpoint.async the
  // copy to host memory is all that holds the step: the shard is written in the background and
  // the checkpoint published later (publish_saved, finish); a save first publishes the one
  // before it. Weights holding a NaN or an infinity on any rank are not saved (a warning says so).
  void save(int it, int nonfinite_in_a_row, const Tensor* previous = nullptr);
  // The background save not yet published (its number), else -1; whether this rank's shard of
  // it is still being written. The trainer exchanges both (StopRequest::poll).
  int64_t pending() const;
  bool writing() const;
  // Collective, every rank with the same `saved` (the exchange's agreement): publishes that save
  // once every rank has written it; nothing when saved < 0 or it is not the pending one.
  // `at`: the iteration that has just ended (recorded as the save's publication).
  void publish_saved(int64_t saved, int at);
  // Collective: publishes the pending save, if any. Before the run ends (after iteration `at`).
  void finish(int at);
  // How long each save held the training thread (the copy to host memory, starting or doing
  // the write, publishing), and how long its shard write took on this rank: [save].
  const std::vector<double>& stall_s() const { return stall_s_; }
  const std::vector<double>& write_s() const { return write_s_; }
  // The iteration after which each save was published: [save].
  const std::vector<int>& published_at() const { return published_at_; }

 private:
  std::unique_ptr<DirLock> lock_;  // checkpoint.dir's, on rank 0 (dir_lock.h)
  // Whether every rank's weights are finite (collective over the world).
  bool weights_finite();
  // Publishes pending save `save` after iteration `at` (collective); the time it takes adds to
  // that save's stall.
  void publish(int64_t save, int at);

  const RunLayout& run_;
  const ModelDescription& desc_;
  ProcessGroups& groups_;
  Model& model_;
  AdamW& opt_;
  GradReducer& reducer_;
  Backend& be_;
  bool lead_;
  std::unique_ptr<CheckpointSaver> saver_;  // when checkpoint.dir is set
  std::vector<double> stall_s_, write_s_;   // [save]
  std::vector<int> published_at_;           // [save]
};

}  // namespace strata
