// pipeline.h — the pipeline executor: runs one stage's schedule instructions (schedules/) with
// non-blocking transfers through the Communicator.
//
// The executor knows nothing of the model: a PipelineStage (launch/train/pipeline_stage.h, over
// any model) does the compute of forward(mb, chunk) / backward(mb, chunk) and the step-level
// work, and the executor moves tensors between stages as the instructions say:
//   - receives post an irecv and wait for it (under the watchdog, with the instruction as the
//     wait context, so a hang names the schedule step);
//   - sends are non-blocking; their buffers are kept alive until they complete (checked at each
//     instruction, all waited at the end of run());
//   - adjacent sends/receives with the same group number are posted together as one batch, as
//     Megatron's send_forward_recv_backward, so opposite-direction exchanges cannot deadlock.
// Message tags encode (micro-batch, receiving chunk, direction), so a message can only match
// the receive it is meant for.
//
// Every compute instruction and every receive wait is timed: events() gives the timeline of the
// last run() (for the Chrome trace) and compute_s() the busy time of the compute (for the
// measured bubble).
//
// Thread-safety: one executor per rank, driven from the training thread.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "schedules/schedule.h"

namespace strata {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Shape of the tensors that move between pieces (activations and their gradients).
  virtual Shape boundary_shape() const = 0;
  // Element type of what crosses a boundary (bf16 activations in mixed precision).
  virtual DType boundary_dtype() const { return DType::kF32; }
  // forward(mb, chunk): input is the received activation (undefined on the model's first piece);
  // returns the output to send (undefined on the last piece).
  virtual Tensor forward(int mb, int chunk, const Tensor& input) = 0;
  // backward(mb, chunk): grad_output is the received gradient (undefined on the last piece);
  // returns the input gradient to send (undefined on the first piece).
  virtual Tensor backward(int mb, int chunk, const Tensor& grad_output) = 0;
  // Zero-bubble split of backward: the input gradient now, the weight gradient later.
  virtual Tensor backward_input(int mb, int chunk, const Tensor& grad_output) = 0;
  virtual void backward_weight(int mb, int chunk) = 0;
  virtual void reduce_grads() = 0;
  virtual void optimizer_step() = 0;
  virtual void switch_weights() = 0;
  // Moves the stage's background work on without blocking (PipeDream-2BW's step, whose
  // collectives complete while the pipeline runs); true while some is left. The executor calls
  // it while it waits, since a neighbour may be waiting for that work.
  virtual bool progress() { return false; }
};

struct PipelineEvent {
  Op op = Op::kForward;
  int mb = -1;
  int chunk = 0;
  double start_s = 0;  // from the start of run()
  double end_s = 0;
};

class PipelineExecutor {
 public:
  // pp: the pipeline group (group rank = stage). p stages, v chunks per stage.
  PipelineExecutor(Communicator& pp, Backend& backend, int stage, int p, int v);
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  void run(const std::vector<Instr>& list, PipelineStage& stage);

  const std::vector<PipelineEvent>& events() const { return events_; }
  double compute_s() const;  // Σ duration of forward and backward instructions, last run

 private:
  using Key = std::pair<int, int>;  // (mb, chunk)
  int tag(int mb, int chunk, bool grad) const;
  // Returns the group's first receive (the wait to draw on the timeline), or nullptr.
  const Instr* post(const std::vector<Instr>& group, PipelineStage& stage);
  void reap_sends(bool wait, PipelineStage& stage);
  // Waits for r, moving the stage's background work on meanwhile (PipelineStage::progress).
  void wait(Request r, PipelineStage& stage);

  Communicator& pp_;
  Backend& be_;
  int stage_, p_, v_;
  std::map<Key, Tensor> inputs_, grads_in_;    // received, awaiting their compute
  std::map<Key, Tensor> outputs_, grads_out_;  // computed, awaiting their send
  struct InFlight {
    Request req;
    std::vector<Tensor> bufs;  // alive until the sends complete
  };
  std::vector<InFlight> sends_;
  std::vector<PipelineEvent> events_;
};

}  // namespace strata
