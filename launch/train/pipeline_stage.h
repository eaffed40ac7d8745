// pipeline_stage.h — one pipeline stage of any model (models/model.h) on this rank: the compute
// side of the executor's instructions (runtime/engine/pipeline.h), the loss and gradient-norm sums,
// the reduction of gradients and the optimizer step with clipping.
//
// Loss: the loss of an iteration is the mean over the tokens of the global batch that count
// (docs/contracts.md); their number comes from the data (DataSource::loss_tokens), known before the
// compute, so the backward is scaled by its inverse and the summed gradient is that of the mean.
//
// PipeDream-2BW (a schedule that does not flush: schedules/schedule.h's flushes_every_batch):
// micro-batches are numbered across batches (batch b = mb / m) and batch
// b runs forward and backward on weight version W(max(b−1, 0)); step j computes
// W(j+1) = W(j) − update(∇f at W(j−1)) into the buffer of W(j−1), which no micro-batch uses any
// more. Version k lives in versions_[k % 2]: at most two versions are ever held. Evaluation
// (begin(..., training = false)) runs on the newest version, W(steps taken).
// Nothing that crosses stages blocks the pipeline at a batch boundary: reduce_grads() of batch
// j only starts what the update needs from other stages and ranks — the tied embedding's sum,
// the data-parallel reduction, the squared gradient norm over the model-parallel group (for
// clipping, exact), the loss over the pipeline — and batch j+1 accumulates its gradients into a
// second buffer meanwhile; progress() moves that chain on without blocking (the executor calls
// it while it waits) and optimizer_step(), which the schedule places just before W(j+1) is
// first needed, completes it and applies the update. Same sums in the same order as the
// blocking step: the losses and weights are those of the flushing implementation, bit for bit.
//
// Parameters held by two stages (ParamInfo::tied: a tied embedding split over the first and last
// stage) have their gradients summed over the embedding group in reduce_grads(), after the
// pipeline has drained, before they are reduced over the data group.
//
// Thread-safety: driven from the training thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "launch/train/batches.h"
#include "launch/train/run_layout.h"
#include "models/model.h"
#include "runtime/comm/process_groups.h"
#include "runtime/data/data_source.h"
#include "runtime/engine/grad_reducer.h"
#include "runtime/engine/optimizer.h"
#include "runtime/engine/pipeline.h"

namespace strata {

// What one optimizer step saw, the same on every rank.
struct StepRecord {
  int batch = 0;    // 0-based
  double loss = 0;  // mean over the global batch
  double norm = 0;  // global gradient norm before clipping
  double lr = 0;
  bool finite = true;
  // A mixture of experts: coef × the load-balancing loss, the mean over the batch's
  // micro-batches, and the worst layer's max / mean assignments per expert.
  std::optional<double> aux_loss, expert_load;
  double at_s = 0;  // when the step finished, seconds from set_clock()
  // Seconds the step waited for its sums over other stages and ranks (2bw: completing what
  // ReduceGrads started; flushing schedules: the blocking loss and norm sums).
  double wait_s = 0;
};

// Sum of a double over a group (float on the wire: the figures summed here are losses and
// squared norms, for which float's 1e-7 relative rounding is far inside 1e-5). A group of device
// tensors (NCCL, staged) takes the value through a one-element tensor of the backend.
double sum_over(Backend& be, Communicator* c, double v);
// The maximum, the same way.
double max_over(Backend& be, Communicator* c, double v);

// sum_over started now and read later: the same float all-reduce, non-blocking. Its buffer is
// a member: the object stays where it is while a sum is in flight.
class PendingSum {
 public:
  void start(Backend& be, Communicator* c, double v, ReduceOp op = ReduceOp::kSum);
  bool test();    // never blocks; true once the sum is there
  double wait();  // the sum (the value itself over no group)

 private:
  Backend* be_ = nullptr;
  float host_ = 0;
  Tensor device_;
  Request req_;
  std::optional<double> alone_;  // no group: the value, unrounded as sum_over returns it
};

// The gradient reducer's view of the model's parameters: a parameter replicated over the tensor
// group has the same gradient on every member, so its squares count once, on tensor rank 0; the
// last stage's copy of a tied parameter counts nowhere (it is the first stage's again).
std::vector<ParamSpan> param_spans(const ParamStore& params);

class ModelStage final : public PipelineStage {
 public:
  ModelStage(const RunLayout& run, Model& model, Backend& be, const DataSource& data,
             ProcessGroups& groups, GradReducer& reducer, AdamW& opt);

  // Starts batch `iter` (0-based) of `split` (2bw: the first of the batches the list covers);
  // training or forward-only evaluation.
  void begin(Split split, uint64_t iter, bool training);
  void reset_list() { steps_in_list_ = 0; }
  // Σ token losses of this stage's forwards of batch `b` (relative to begin()).
  double loss_sum(int b = 0) const;
  // The tokens the loss of batch `b` (relative to begin()) averages over, in the whole global
  // batch.
  double loss_tokens(int b = 0) const;
  const std::vector<StepRecord>& records() const { return records_; }
  void set_clock(std::chrono::steady_clock::time_point t0) { t0_ = t0; }
  // The newest weights (what evaluation and the final parameters use).
  const Tensor& newest_params() const { return versions_[steps_ % 2]; }
  // Points the model at the newest weights once a list has run (2bw ends a list with the model
  // on an older version; a flushing schedule has only one).
  void use_newest_weights();
  // 2bw after at least one step: the older version W(steps − 1), which the next batch runs on,
  // saved beside the newest; null for a flushing schedule (one version).
  const Tensor* previous_params() const {
    return two_versions_ ? &versions_[(steps_ + 1) % 2] : nullptr;
  }
  // Resuming after `steps` steps, the model holding W(steps): 2bw gets back `previous`,
  // W(steps − 1); a flushing schedule needs nothing more.
  void resume(int steps, const std::vector<float>& previous);
  // Called after each optimizer step with its iteration (1-based) and the weights it wrote.
  void set_on_step(std::function<void(int, const Tensor&)> f) { on_step_ = std::move(f); }

  Shape boundary_shape() const override;
  DType boundary_dtype() const override { return model_.activation_dtype(); }
  // A boundary tensor carries Model::boundary_stats() doubles behind the activation when the
  // model has any (a mixture's balancing loss over several pieces): boundary_shape() is then
  // flat, activation and statistics.
  Tensor forward(int mb, int chunk, const Tensor& input) override;
  Tensor backward(int mb, int chunk, const Tensor& grad_output) override;
  // Zero-bubble split: the B pass computes input gradients (sent on at once), the W pass the
  // weight gradients later, filling the pipeline bubble. The activations stay alive from F to W.
  Tensor backward_input(int mb, int chunk, const Tensor& grad_output) override;
  void backward_weight(int mb, int chunk) override;
  void reduce_grads() override;
  void optimizer_step() override;
  void switch_weights() override {}  // versions are chosen per micro-batch (use_version_of)
  bool progress() override;

 private:
  // The statistics' size in elements of the boundary type; the activation part of a received
  // boundary tensor (its statistics into *stats); an activation with statistics behind it.
  int64_t stats_elements() const;
  Tensor boundary_part(const Tensor& received, std::vector<double>* stats) const;
  Tensor with_stats(const Tensor& t, const std::vector<double>& stats) const;
  // backward_piece with the statistics taken from and added to the boundary tensors.
  Tensor backward_piece(PieceActs& acts, int mb, const Tensor& grad_output,
                        bool defer_weight_grads);
  int piece_index(int chunk) const { return chunk * run_.layout.pipeline + groups_.pp_rank; }
  bool last_of_batch(int mb) const {
    return mb % run_.layout.num_microbatches == run_.layout.num_microbatches - 1;
  }
  void use_version_of(int mb);
  float grad_scale(int mb) const;
  const ModelBatch& batch(int mb);
  BatchKey batch_key(int mb) const;
  PieceActsPtr take_acts(int mb, int chunk, const char* what);
  // 2bw: moves the deferred step's chain on (blocking: to its end); true while it is not done.
  bool advance_step(bool block);
  // The loss counted the tokens the data said it would (this rank's share of batch b).
  void check_loss_tokens(int b) const;
  Communicator* tied_group(const ParamInfo& p) const;  // the embedding group, checked

  const RunLayout& run_;
  Model& model_;
  Backend& be_;
  const DataSource& data_;
  ProcessGroups& groups_;
  GradReducer& reducer_;
  AdamW& opt_;
  const bool two_versions_;  // 2bw: the schedule does not flush, two weight versions are alive
  const bool moe_;           // the model's MLPs are mixtures of experts (StepRecord's figures)
  Split split_ = Split::kTrain;
  uint64_t iter_ = 0;
  bool training_ = true;
  std::map<int, LossSum> loss_by_batch_;  // [batch − iter_] on this stage
  std::vector<StepRecord> records_;
  int steps_ = 0;          // 2bw: optimizer steps taken (W(steps_) is the newest version)
  int steps_in_list_ = 0;  // steps taken in the current instruction list
  Tensor versions_[2];     // 2bw: W(k) in versions_[k % 2]; flushing: versions_[0] only
  std::function<void(int, const Tensor&)> on_step_;
  // 2bw's deferred step of batch `batch`: each phase starts when the one before completes.
  struct DeferredStep {
    enum class Phase { kIdle, kTied, kData, kShardNorm, kNorm, kReady };
    Phase phase = Phase::kIdle;
    int batch = 0;              // relative to begin()
    std::vector<Request> tied;  // the tied parameters' sums over the embedding group
    std::vector<int> tied_params;
    PendingSum loss;  // over the pipeline (then, at the step, the data group)
    PendingSum sq;    // Σ g²: over the data group (ZeRO-1), then the model-parallel group
  };
  DeferredStep step_;
  Tensor grad_buffers_[2];  // 2bw: consecutive batches accumulate into alternate buffers
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::map<int, ModelBatch> batches_;                 // [mb] this batch's data
  BatchPrefetcher prefetcher_{data_};                 // the next micro-batch's data
  std::map<std::pair<int, int>, PieceActsPtr> acts_;  // [(mb, chunk)] awaiting backward
};

}  // namespace strata
