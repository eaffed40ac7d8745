#include "runtime/engine/pipeline.h"

#include <chrono>
#include <thread>

#include "runtime/base/behaviour.h"
#include "runtime/base/check.h"
#include "runtime/comm/watchdog.h"

namespace strata {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
bool is_comm(Op op) {
  return op == Op::kRecvActivation || op == Op::kSendActivation || op == Op::kRecvGrad ||
         op == Op::kSendGrad;
}
}  // namespace

PipelineExecutor::PipelineExecutor(Communicator& pp, Backend& backend, int stage, int p, int v)
    : pp_(pp), be_(backend), stage_(stage), p_(p), v_(v) {}

int PipelineExecutor::tag(int mb, int chunk, bool grad) const {
  // MPI guarantees tags up to 32767; order between one pair of ranks keeps wrapped tags apart.
  return ((mb * v_ + chunk) * 2 + (grad ? 1 : 0)) % 32768;
}

double PipelineExecutor::compute_s() const {
  double s = 0;
  for (const PipelineEvent& e : events_)
    if (e.op == Op::kForward || e.op == Op::kBackward || e.op == Op::kBackwardInput ||
        e.op == Op::kBackwardWeight)
      s += e.end_s - e.start_s;
  return s;
}

void PipelineExecutor::reap_sends(bool all, PipelineStage& stage) {
  std::vector<InFlight> still;
  for (InFlight& f : sends_) {
    if (all)
      wait(std::move(f.req), stage);
    else if (!f.req.test())
      still.push_back(std::move(f));
  }
  sends_ = std::move(still);
}

// A stage whose background collectives are still open keeps them moving while it waits: a
// neighbour blocked in its own step may need this stage's next contribution before it can send
// what this wait is for. Past the group's timeout the plain wait, and its watchdog, take over.
// The loop yields the core between polls, as MPI's own waits do when ranks share cores.
void PipelineExecutor::wait(Request r, PipelineStage& stage) {
  const double deadline = now_s() + pp_.timeout_s();
  while (stage.progress() && !r.test() && now_s() < deadline) std::this_thread::yield();
  r.wait();
}

// Posts a group of sends and receives together and waits for the receives. Sends are never
// waited here: a send completes when its peer posts the matching receive, which the schedule
// guarantees will happen (the simulator checks it), and waiting for it could deadlock two
// stages that send to each other while each waits for its own send (large messages use MPI's
// rendezvous protocol). Receive buffers are filed under the (mb, chunk) that consumes them.
//
// On a communicator with rendezvous sends (NCCL) a send posted alone would hold up the
// receives after it until its peer receives, and two neighbours each sending first would wait
// for each other. There the group's sends and receives go out as one batch, which NCCL runs
// as one unit, like Megatron's batched send_forward_recv_backward; the wait for the receives
// is then the wait for the whole batch (on a GPU a stream wait, not a host one). The
// schedules pair every send with the receive its peer posts at the same point (interleaved
// by receiving a round ahead); runs_on_rendezvous_sends (simulator.h) proves it per schedule
// with rendezvous sends and the step's collectives, and the trainer runs the ones it cannot
// prove (2bw, interleaved with groups larger than p) over MPI instead (RunLayout::transport,
// launch/train/run_layout.cc).
const Instr* PipelineExecutor::post(const std::vector<Instr>& group, PipelineStage& stage) {
  // What the planner prices (runtime/base/behaviour.h): on MPI the sends go alone, non-blocking; on
  // NCCL a group waits for its sends with its receives.
  static_assert(!behaviour::kHostSendsBlock && behaviour::kDeviceGroupsWaitForSends,
                "pipeline transfers as runtime/base/behaviour.h describes them");
  const bool together = pp_.rendezvous_sends();
  std::vector<P2POp> batch;  // the group's receives; together, its sends too (in group order)
  std::vector<Tensor> send_bufs;
  bool receives = false;
  std::string what;
  for (const Instr& in : group) {
    what += (what.empty() ? "" : " + ") + instr_string(in);
    const Key key{in.mb, in.chunk};
    switch (in.op) {
      case Op::kRecvActivation:
      case Op::kRecvGrad: {
        const bool grad = in.op == Op::kRecvGrad;
        const PieceRef from =
            grad ? next_piece(stage_, in.chunk, p_, v_) : prev_piece(stage_, in.chunk, p_, v_);
        STRATA_CHECK(from.stage >= 0, "receive with no peer piece: " << instr_string(in));
        Tensor buf =
            be_.empty(stage.boundary_shape(), MemCategory::kActivations, stage.boundary_dtype());
        batch.push_back(P2POp::recv(buf.data(), static_cast<size_t>(buf.numel()), buf.dtype(),
                                    from.stage, tag(in.mb, in.chunk, grad)));
        receives = true;
        (grad ? grads_in_ : inputs_)[key] = buf;
        break;
      }
      case Op::kSendActivation:
      case Op::kSendGrad: {
        const bool grad = in.op == Op::kSendGrad;
        const PieceRef to =
            grad ? prev_piece(stage_, in.chunk, p_, v_) : next_piece(stage_, in.chunk, p_, v_);
        std::map<Key, Tensor>& pending = grad ? grads_out_ : outputs_;
        auto it = pending.find(key);
        STRATA_CHECK(it != pending.end(), "send before its compute: " << instr_string(in));
        Tensor buf = it->second;
        pending.erase(it);
        const P2POp op = P2POp::send(buf.data(), static_cast<size_t>(buf.numel()), buf.dtype(),
                                     to.stage, tag(in.mb, to.chunk, grad));
        if (together) {
          batch.push_back(op);
          send_bufs.push_back(std::move(buf));
        } else {
          sends_.push_back(
              {pp_.isend(op.buf, op.count, op.dtype, op.peer, op.tag), {std::move(buf)}});
        }
        break;
      }
      default:
        STRATA_CHECK(false, "not a transfer: " << instr_string(in));
    }
  }
  // The schedule step names what a hang waits for: the NCCL watchdog takes it when the batch
  // is posted (a sends-only batch too, whose send can hang there), MPI's at the wait.
  WaitContextScope scope("stage " + std::to_string(stage_) + ": " + what);
  if (!receives) {
    if (!batch.empty()) sends_.push_back({pp_.ibatch(batch), std::move(send_bufs)});
    return nullptr;
  }
  // The compute after it needs the data. A batch's send buffers may go once it has completed
  // (on a GPU: once the compute stream, which reuses freed memory, is ordered after it).
  wait(pp_.ibatch(batch), stage);
  for (const Instr& in : group)
    if (in.op == Op::kRecvActivation || in.op == Op::kRecvGrad) return &in;
  return nullptr;
}

void PipelineExecutor::run(const std::vector<Instr>& list, PipelineStage& stage) {
  events_.clear();
  const double t0 = now_s();
  for (size_t i = 0; i < list.size();) {
    const Instr& in = list[i];
    if (is_comm(in.op)) {
      std::vector<Instr> group{in};
      size_t j = i + 1;
      if (in.group >= 0)
        while (j < list.size() && list[j].group == in.group && is_comm(list[j].op))
          group.push_back(list[j++]);
      const double start = now_s() - t0;
      // A receive is a wait for a neighbour: it goes on the timeline (not into compute time).
      if (const Instr* r = post(group, stage))
        events_.push_back({r->op, r->mb, r->chunk, start, now_s() - t0});
      i = j;
      reap_sends(false, stage);
      continue;
    }
    const Key key{in.mb, in.chunk};
    PipelineEvent ev{in.op, in.mb, in.chunk, now_s() - t0, 0};
    switch (in.op) {
      case Op::kForward: {
        Tensor input;
        if (auto it = inputs_.find(key); it != inputs_.end()) {
          input = it->second;
          inputs_.erase(it);
        }
        Tensor out = stage.forward(in.mb, in.chunk, input);
        if (out.defined()) outputs_[key] = out;
        break;
      }
      case Op::kBackward:
      case Op::kBackwardInput: {
        Tensor g;
        if (auto it = grads_in_.find(key); it != grads_in_.end()) {
          g = it->second;
          grads_in_.erase(it);
        }
        Tensor dinput = in.op == Op::kBackward ? stage.backward(in.mb, in.chunk, g)
                                               : stage.backward_input(in.mb, in.chunk, g);
        if (dinput.defined()) grads_out_[key] = dinput;
        break;
      }
      case Op::kBackwardWeight:
        stage.backward_weight(in.mb, in.chunk);
        break;
      case Op::kReduceGrads:
        stage.reduce_grads();
        break;
      case Op::kOptimizerStep:
        stage.optimizer_step();
        break;
      case Op::kSwitchWeights:
        stage.switch_weights();
        break;
      default:
        STRATA_CHECK(false, "unhandled instruction " << instr_string(in));
    }
    ev.end_s = now_s() - t0;
    events_.push_back(ev);
    ++i;
  }
  reap_sends(true, stage);
  STRATA_CHECK(inputs_.empty() && grads_in_.empty() && outputs_.empty() && grads_out_.empty(),
               "stage " << stage_ << " ended its schedule with unconsumed transfers");
}

}  // namespace strata
