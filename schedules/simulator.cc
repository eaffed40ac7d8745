// simulator.cc — checks and simulates instruction lists (see simulator.h).
#include "schedules/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

namespace strata {
namespace {

bool is_comm(Op op) {
  return op == Op::kRecvActivation || op == Op::kSendActivation || op == Op::kRecvGrad ||
         op == Op::kSendGrad;
}
bool is_recv(Op op) {
  return op == Op::kRecvActivation || op == Op::kRecvGrad;
}
bool is_send(Op op) {
  return op == Op::kSendActivation || op == Op::kSendGrad;
}

// A transfer, named on the receiving side: (is_grad, receiving stage, mb, receiving chunk).
using TransferKey = std::tuple<int, int, int, int>;

// The transfer a send or receive at (stage, instr) takes part in; false when the neighbouring
// piece does not exist (a send to, or receive from, past the ends of the model).
bool transfer_of(int stage, const Instr& i, int p, int v, TransferKey* key) {
  switch (i.op) {
    case Op::kSendActivation: {
      const PieceRef to = next_piece(stage, i.chunk, p, v);
      *key = TransferKey(0, to.stage, i.mb, to.chunk);
      return to.stage >= 0;
    }
    case Op::kRecvActivation:
      *key = TransferKey(0, stage, i.mb, i.chunk);
      return prev_piece(stage, i.chunk, p, v).stage >= 0;
    case Op::kSendGrad: {
      const PieceRef to = prev_piece(stage, i.chunk, p, v);
      *key = TransferKey(1, to.stage, i.mb, to.chunk);
      return to.stage >= 0;
    }
    case Op::kRecvGrad:
      *key = TransferKey(1, stage, i.mb, i.chunk);
      return next_piece(stage, i.chunk, p, v).stage >= 0;
    default:
      return false;
  }
}

// The stage that must send what a receive at (stage, instr) waits for (-1: none).
int sender_of(int stage, const Instr& i, int p, int v) {
  if (i.op == Op::kRecvActivation) return prev_piece(stage, i.chunk, p, v).stage;
  if (i.op == Op::kRecvGrad) return next_piece(stage, i.chunk, p, v).stage;
  return -1;
}

std::string at(int stage, size_t index, const Instr& i) {
  return "stage " + std::to_string(stage) + " instruction " + std::to_string(index) + " (" +
         instr_string(i) + ")";
}

std::string pair_name(int mb, int chunk) {
  return "micro-batch " + std::to_string(mb) + " chunk " + std::to_string(chunk);
}

// Positions (list indices) of the instructions touching one (mb, chunk) on one stage.
struct PairPos {
  int f = -1, b = -1, w = -1;  // forward, backward or backward-input, backward-weight
  int ra = -1, sa = -1;        // receive input, send output
  int rg = -1, sg = -1;        // receive output gradient, send input gradient
  bool split = false;          // backward is a backward-input pass (W comes separately)
};

struct StageFacts {
  int peak_inflight = 0;
  int peak_versions = 0;
};

// The per-stage checks of simulator.h on one stage's list, in the order their problems are
// reported: the list indexed (groups, and each (mb, chunk)'s instructions once each), every
// pair's order and transfers, each batch's ReduceGrads and OptimizerStep, 2bw's weight switches,
// then the peaks the list reaches.
class StageChecker {
 public:
  StageChecker(const ScheduleSpec& spec, int stage, const std::vector<Instr>& list,
               std::vector<std::string>* problems)
      : stage_(stage),
        list_(list),
        problems_(problems),
        p_(spec.stages),
        v_(spec.chunks),
        m_(spec.microbatches),
        n_mb_(spec.microbatches * spec.batches),
        n_(spec.batches),
        two_bw_(spec.kind == ScheduleKind::kTwoBW),
        st_("stage " + std::to_string(stage) + ": "),
        pairs_(static_cast<size_t>(n_mb_ * v_)) {}

  StageFacts run() {
    index_list();
    check_pairs();
    check_batches();
    if (!two_bw_ && !switches_.empty()) bad(st_ + "SwitchWeights in a schedule that is not 2bw");
    if (two_bw_) check_weight_switches();
    const StageFacts facts = peaks();
    if (two_bw_ && facts.peak_versions > 2)
      bad(st_ + "needs " + std::to_string(facts.peak_versions) +
          " weight versions at once; 2bw holds two");
    return facts;
  }

 private:
  void bad(const std::string& what) { problems_->push_back(what); }
  const PairPos& pair(int mb, int chunk) const {
    return pairs_[static_cast<size_t>(mb * v_ + chunk)];
  }

  // Where each instruction sits: groups checked to hold only communication in one contiguous
  // run, the batch-level instructions listed, and each (mb, chunk)'s instructions recorded, each
  // kind once.
  void index_list() {
    std::map<int, std::pair<int, int>> groups;  // group -> (first index, count)
    for (size_t idx = 0; idx < list_.size(); ++idx) {
      const Instr& in = list_[idx];
      const int pos = static_cast<int>(idx);
      if (in.group >= 0) {
        if (!is_comm(in.op))
          bad(at(stage_, idx, in) + " is in group " + std::to_string(in.group) +
              " but groups hold only sends and receives");
        auto it = groups.find(in.group);
        if (it == groups.end()) {
          groups[in.group] = {pos, 1};
        } else {
          if (it->second.first + it->second.second != pos)
            bad(at(stage_, idx, in) + ": group " + std::to_string(in.group) +
                " is not one contiguous run");
          ++it->second.second;
        }
      }
      if (in.op == Op::kReduceGrads) {
        reduces_.push_back(pos);
        continue;
      }
      if (in.op == Op::kOptimizerStep) {
        steps_.push_back(pos);
        continue;
      }
      if (in.op == Op::kSwitchWeights) {
        switches_.push_back(pos);
        continue;
      }
      if (in.mb < 0 || in.mb >= n_mb_ || in.chunk < 0 || in.chunk >= v_) {
        bad(at(stage_, idx, in) + " names " + pair_name(in.mb, in.chunk) + ", outside " +
            std::to_string(n_mb_) + " micro-batches x " + std::to_string(v_) + " chunks");
        continue;
      }
      record(idx, in);
    }
  }

  // Records the instruction at `idx` in its (mb, chunk)'s positions.
  void record(size_t idx, const Instr& in) {
    const int pos = static_cast<int>(idx);
    PairPos& pp = pairs_[static_cast<size_t>(in.mb * v_ + in.chunk)];
    auto set_once = [&](int* slot, const char* what) {
      if (*slot >= 0)
        bad(at(stage_, idx, in) + ": " + what + " of " + pair_name(in.mb, in.chunk) +
            " a second time");
      else
        *slot = pos;
    };
    switch (in.op) {
      case Op::kForward:
        set_once(&pp.f, "forward");
        break;
      case Op::kBackward:
        set_once(&pp.b, "backward");
        break;
      case Op::kBackwardInput:
        set_once(&pp.b, "backward");
        pp.split = true;
        break;
      case Op::kBackwardWeight:
        set_once(&pp.w, "weight pass");
        break;
      case Op::kRecvActivation:
        set_once(&pp.ra, "receive of the input");
        break;
      case Op::kSendActivation:
        set_once(&pp.sa, "send of the output");
        break;
      case Op::kRecvGrad:
        set_once(&pp.rg, "receive of the output gradient");
        break;
      case Op::kSendGrad:
        set_once(&pp.sg, "send of the input gradient");
        break;
      default:
        break;
    }
  }

  // Every (mb, chunk) forwarded and backwarded once, in order, with its transfers around them.
  void check_pairs() {
    for (int mb = 0; mb < n_mb_; ++mb) {
      for (int c = 0; c < v_; ++c) {
        const PairPos& pp = pair(mb, c);
        const std::string name = pair_name(mb, c);
        const bool has_prev = prev_piece(stage_, c, p_, v_).stage >= 0;
        const bool has_next = next_piece(stage_, c, p_, v_).stage >= 0;
        if (pp.f < 0) bad(st_ + name + " is never forwarded");
        if (pp.b < 0) bad(st_ + name + " is never backwarded");
        if (pp.split && pp.w < 0)
          bad(st_ + name + " gets a backward-input pass but no weight pass");
        if (!pp.split && pp.w >= 0) bad(st_ + name + " gets a weight pass after a full backward");
        if (pp.f >= 0 && pp.b >= 0 && pp.b < pp.f)
          bad(st_ + name + " is backwarded before forward");
        if (pp.b >= 0 && pp.w >= 0 && pp.w < pp.b)
          bad(st_ + name + " gets its weight pass before its backward-input pass");
        check_transfers(pp, name, has_prev, has_next);
      }
    }
  }

  // Data the forward and backward need must be received before them and what they produce sent
  // after them; a piece at an end of the model neither receives nor sends.
  void check_transfers(const PairPos& pp, const std::string& name, bool has_prev, bool has_next) {
    if (has_prev) {
      if (pp.ra < 0)
        bad(st_ + name + ": the forward's input is never received");
      else if (pp.f >= 0 && pp.ra > pp.f)
        bad(st_ + name + ": input received after the forward");
      if (pp.sg < 0)
        bad(st_ + name + ": the input gradient is never sent");
      else if (pp.b >= 0 && pp.sg < pp.b)
        bad(st_ + name + ": input gradient sent before the backward");
    } else {
      if (pp.ra >= 0) bad(st_ + name + ": receives an input though it is the first piece");
      if (pp.sg >= 0) bad(st_ + name + ": sends an input gradient though it is the first piece");
    }
    if (has_next) {
      if (pp.sa < 0)
        bad(st_ + name + ": the forward's output is never sent");
      else if (pp.f >= 0 && pp.sa < pp.f)
        bad(st_ + name + ": output sent before the forward");
      if (pp.rg < 0)
        bad(st_ + name + ": the output gradient is never received");
      else if (pp.b >= 0 && pp.rg > pp.b)
        bad(st_ + name + ": output gradient received after the backward");
    } else {
      if (pp.sa >= 0) bad(st_ + name + ": sends an output though it is the last piece");
      if (pp.rg >= 0) bad(st_ + name + ": receives an output gradient though it is the last piece");
    }
  }

  // The list position of batch j's last backward (or weight pass) on this stage; -1 for none.
  int last_backward_of(int j) const {
    int last_backward = -1;
    for (int mb = j * m_; mb < (j + 1) * m_; ++mb)
      for (int c = 0; c < v_; ++c) {
        const PairPos& pp = pair(mb, c);
        last_backward = std::max({last_backward, pp.b, pp.w});
      }
    return last_backward;
  }

  // One reduce and one step per batch, after every backward of that batch.
  void check_batches() {
    if (static_cast<int>(reduces_.size()) != n_ || static_cast<int>(steps_.size()) != n_) {
      bad(st_ + std::to_string(reduces_.size()) + " ReduceGrads and " +
          std::to_string(steps_.size()) + " OptimizerStep for " + std::to_string(n_) +
          " batch(es); expected one each per batch");
      return;
    }
    for (int j = 0; j < n_; ++j) {
      if (steps_[static_cast<size_t>(j)] < reduces_[static_cast<size_t>(j)])
        bad(st_ + "the optimizer step of batch " + std::to_string(j) + " precedes its ReduceGrads");
      if (last_backward_of(j) > reduces_[static_cast<size_t>(j)])
        bad(st_ + "ReduceGrads of batch " + std::to_string(j) +
            " comes before all of that batch's backwards");
    }
  }

  // 2bw: one SwitchWeights per batch, after its step; each step before the next batch takes over
  // its gradients; batch b >= 2 forwarded only after the switch of batch b-2.
  void check_weight_switches() {
    if (static_cast<int>(switches_.size()) != n_) {
      bad(st_ + std::to_string(switches_.size()) + " SwitchWeights for " + std::to_string(n_) +
          " batch(es); 2bw switches once per batch");
      return;
    }
    if (static_cast<int>(steps_.size()) != n_) return;
    for (int j = 0; j < n_; ++j)
      if (switches_[static_cast<size_t>(j)] < steps_[static_cast<size_t>(j)])
        bad(st_ + "SwitchWeights of batch " + std::to_string(j) + " precedes its optimizer step");
    // The step of batch j reads its gradient buffer and reduction, which batch j+1 takes over
    // with the backward of its last micro-batch.
    for (int j = 0; j + 1 < n_; ++j) {
      const int last_backward = last_backward_of(j + 1);
      if (last_backward >= 0 && last_backward < steps_[static_cast<size_t>(j)])
        bad(st_ + "the optimizer step of batch " + std::to_string(j) +
            " comes after the last backward of batch " + std::to_string(j + 1));
    }
    // Batch b >= 2 runs on W(b-1), which exists only from the switch of batch b-2 on.
    for (int b = 2; b < n_; ++b)
      for (int mb = b * m_; mb < (b + 1) * m_; ++mb)
        for (int c = 0; c < v_; ++c) {
          const PairPos& pp = pair(mb, c);
          if (pp.f >= 0 && pp.f < switches_[static_cast<size_t>(b - 2)])
            bad(st_ + "forward of " + pair_name(mb, c) + " (batch " + std::to_string(b) +
                ") before the weight switch of batch " + std::to_string(b - 2));
        }
  }

  // Peak in-flight pairs (forward to end of backward) and weight versions, walking the list.
  StageFacts peaks() const {
    StageFacts facts;
    int inflight = 0, newest = 0;
    std::vector<int> finished(static_cast<size_t>(n_), 0);  // [batch] pairs done
    std::set<int> open;  // batches started and not finished on this stage
    for (const Instr& in : list_) {
      if (in.op == Op::kOptimizerStep) ++newest;
      if (in.mb >= 0 && in.mb < n_mb_ && in.chunk >= 0 && in.chunk < v_) {
        const PairPos& pp = pair(in.mb, in.chunk);
        const int batch = in.mb / m_;
        if (in.op == Op::kForward) {
          ++inflight;
          open.insert(batch);
        }
        const bool ends = pp.split ? in.op == Op::kBackwardWeight : in.op == Op::kBackward;
        if (ends) {
          --inflight;
          if (++finished[static_cast<size_t>(batch)] == m_ * v_) open.erase(batch);
        }
      }
      facts.peak_inflight = std::max(facts.peak_inflight, inflight);
      // Batch b runs on version max(b-1, 0); the newest version is kept for batches to come.
      std::set<int> versions = {newest};
      for (int b : open) versions.insert(std::max(b - 1, 0));
      facts.peak_versions = std::max(facts.peak_versions, static_cast<int>(versions.size()));
    }
    return facts;
  }

  const int stage_;
  const std::vector<Instr>& list_;
  std::vector<std::string>* problems_;
  const int p_, v_, m_;
  const int n_mb_;  // micro-batches over all batches
  const int n_;     // batches
  const bool two_bw_;
  const std::string st_;                         // "stage s: ", the problems' prefix
  std::vector<PairPos> pairs_;                   // [mb * v + chunk]
  std::vector<int> reduces_, steps_, switches_;  // list positions, in order
};

double duration_of(int stage, const Instr& in, const SimOptions& opt) {
  if (opt.duration) return opt.duration(stage, in);
  switch (in.op) {
    case Op::kForward:
      return opt.forward;
    case Op::kBackward:
      return opt.backward;
    case Op::kBackwardInput:
      return opt.backward_input;
    case Op::kBackwardWeight:
      return opt.backward_weight;
    case Op::kReduceGrads:
      return opt.reduce;
    case Op::kOptimizerStep:
      return opt.optimizer;
    case Op::kSwitchWeights:
      return opt.switch_weights;
    default:
      return 0.0;
  }
}

// One call of simulate(): the lists' transfers matched across stages and each stage's list
// checked (problems found without running), then the event-driven run, then why any stage
// stopped short, then the result's totals. Each step reads and extends the state the ones before
// it left.
class Simulation {
 public:
  Simulation(const ScheduleSpec& spec, const std::vector<std::vector<Instr>>& lists,
             const SimOptions& opt, SimResult* r)
      : spec_(spec),
        lists_(lists),
        opt_(opt),
        r_(*r),
        p_(spec.stages),
        v_(spec.chunks),
        deferred_(spec.kind == ScheduleKind::kTwoBW),
        pc_(static_cast<size_t>(p_), 0),
        now_(static_cast<size_t>(p_), 0.0),
        posted_(static_cast<size_t>(p_), false) {}

  // Cross-stage matching: each transfer sent exactly once and received exactly once.
  void match_transfers() {
    std::map<TransferKey, std::pair<int, size_t>> first_use;  // -> (stage, index) for messages
    for (int s = 0; s < p_; ++s) {
      const auto& list = lists_[static_cast<size_t>(s)];
      for (size_t idx = 0; idx < list.size(); ++idx) {
        const Instr& in = list[idx];
        if (!is_comm(in.op)) continue;
        TransferKey key;
        if (!transfer_of(s, in, p_, v_, &key)) {
          static_problems_.push_back(at(s, idx, in) +
                                     (is_send(in.op) ? " sends past" : " receives from past") +
                                     " the end of the model");
          continue;
        }
        auto& counts = transfers_[key];
        (is_send(in.op) ? counts.first : counts.second) += 1;
        first_use.emplace(key, std::make_pair(s, idx));
      }
    }
    for (const auto& [key, counts] : transfers_) {
      if (counts.first == 1 && counts.second == 1) continue;
      const auto& [is_grad, to_stage, mb, chunk] = key;
      const auto& [s, idx] = first_use[key];
      static_problems_.push_back(
          std::string(is_grad ? "gradient" : "activation") + " of " + pair_name(mb, chunk) +
          " for stage " + std::to_string(to_stage) + " is sent " + std::to_string(counts.first) +
          " time(s) and received " + std::to_string(counts.second) + " time(s) (first at " +
          at(s, idx, lists_[static_cast<size_t>(s)][idx]) + "); each needs exactly one of each");
    }
  }

  // The per-stage checks (StageChecker), and each stage's peaks.
  void check_stages() {
    r_.peak_inflight.assign(static_cast<size_t>(p_), 0);
    r_.peak_weight_versions.assign(static_cast<size_t>(p_), 0);
    for (int s = 0; s < p_; ++s) {
      const StageFacts f =
          StageChecker(spec_, s, lists_[static_cast<size_t>(s)], &static_problems_).run();
      r_.peak_inflight[static_cast<size_t>(s)] = f.peak_inflight;
      r_.peak_weight_versions[static_cast<size_t>(s)] = f.peak_versions;
    }
  }

  // Event-driven run. Each stage advances as far as it can; a pass over all stages that
  // moves none of them means every unfinished stage waits for a send that cannot come.
  // Times are a pure function of the lists and durations (each instruction starts when the
  // stage and its data are ready), so the order in which stages are visited does not matter.
  void run() {
    r_.busy.assign(static_cast<size_t>(p_), 0.0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < p_; ++s)
        while (advance(s)) progress = true;
    }
  }

  // Whether every stage finished; for each that did not, the instruction it stopped at and
  // why (deadlock problems first, causes before their consequences, then the static ones).
  void explain_stops() {
    r_.finished = true;
    r_.blocked_at.assign(static_cast<size_t>(p_), -1);
    std::vector<std::string> deadlock;
    size_t root_causes = 0;
    for (int s = 0; s < p_; ++s) {
      const auto& list = lists_[static_cast<size_t>(s)];
      const size_t i = pc_[static_cast<size_t>(s)];
      if (i >= list.size()) continue;
      r_.finished = false;
      if (opt_.collectives && !is_comm(list[i].op)) {  // stopped at a collective
        r_.blocked_at[static_cast<size_t>(s)] = static_cast<int>(i);
        deadlock.push_back(collective_wait(s, i));
        continue;
      }
      const size_t k = waiting_transfer(s);
      r_.blocked_at[static_cast<size_t>(s)] = static_cast<int>(k);
      bool never = false;
      const std::string why = transfer_wait(s, k, &never);
      // A transfer whose other end exists nowhere is the cause; the stages waiting on stages
      // that wait are its consequences, so causes are listed first.
      deadlock.insert(never ? deadlock.begin() + static_cast<long>(root_causes++) : deadlock.end(),
                      why);
    }
    r_.problems = deadlock;
    r_.problems.insert(r_.problems.end(), static_problems_.begin(), static_problems_.end());
  }

  // Makespan, bubble and the timeline in time order.
  void summarize() {
    for (double t : now_) r_.makespan = std::max(r_.makespan, t);
    double busy = 0.0;
    for (double b : r_.busy) busy += b;
    const double total = r_.makespan * p_;
    if (total > 0.0) r_.bubble_fraction = 1.0 - busy / total;
    if (busy > 0.0) r_.bubble_ratio = (total - busy) / busy;
    std::stable_sort(r_.timeline.begin(), r_.timeline.end(),
                     [](const TimelineEvent& a, const TimelineEvent& b) {
                       return std::tie(a.start, a.stage) < std::tie(b.start, b.stage);
                     });
  }

 private:
  // Collectives (opt.collectives): batch b's ReduceGrads of the first and last stage, and its
  // OptimizerStep of every stage, each the k-th of its kind in the stage's list.
  struct Collective {
    std::set<int> members;  // the stages it reduces over
    std::set<int> arrived;
    double ready = 0.0;  // when the last member arrived
  };

  // Posts a send (its time) or a receive (the time it was posted) at the stage's current time.
  void post(int s, const Instr& in) {
    TransferKey key;
    if (!transfer_of(s, in, p_, v_, &key)) return;
    (is_send(in.op) ? sent_ : posted_recv_).emplace(key, now_[static_cast<size_t>(s)]);
  }
  // With rendezvous sends, when the receive matching a send was posted; false until then.
  bool matched(int s, const Instr& in, double* t) const {
    TransferKey key;
    if (!transfer_of(s, in, p_, v_, &key)) return false;
    auto it = posted_recv_.find(key);
    if (it == posted_recv_.end()) return false;
    *t = it->second;
    return true;
  }
  // Arrival time of what a receive waits for; false while it has not been sent.
  bool arrival(int s, const Instr& in, double* t) const {
    TransferKey key;
    if (!transfer_of(s, in, p_, v_, &key)) return false;
    auto it = sent_.find(key);
    if (it == sent_.end()) return false;
    double start = it->second;
    if (opt_.transfer_at_receive) {
      auto posted_at = posted_recv_.find(key);
      if (posted_at != posted_recv_.end()) start = std::max(start, posted_at->second);
    }
    *t = start + opt_.latency;
    return true;
  }
  // The batch of the instruction at (s, i): how many instructions of `op` come before it.
  int batch_of(int s, size_t i, Op op) const {
    const auto& list = lists_[static_cast<size_t>(s)];
    int batch = 0;
    for (size_t k = 0; k < i; ++k) batch += list[k].op == op ? 1 : 0;
    return batch;
  }
  Collective& collective_at(int s, size_t i, Op op) {
    Collective& c = collectives_[{op, batch_of(s, i, op)}];
    if (op == Op::kOptimizerStep) {
      for (int q = 0; q < p_; ++q) c.members.insert(q);
    } else if (p_ > 1 && (s == 0 || s == p_ - 1)) {
      c.members = {0, p_ - 1};
    }
    return c;
  }
  // 2bw: batch b's ReduceGrads only posts its collectives (the tied embedding's and the gradient
  // norm's sums, over every stage) and its OptimizerStep waits for them: one collective per
  // batch, arrived at by each stage's ReduceGrads, completed at its OptimizerStep.
  Collective& deferred_step(int s, size_t i, Op op) {
    Collective& c = collectives_[{Op::kReduceGrads, batch_of(s, i, op)}];
    for (int q = 0; q < p_; ++q) c.members.insert(q);
    return c;
  }

  // Runs the instruction (or group) at pc[s]; false when it must wait.
  bool advance(int s) {
    const auto& list = lists_[static_cast<size_t>(s)];
    size_t& i = pc_[static_cast<size_t>(s)];
    if (i >= list.size()) return false;
    const Instr& in = list[i];
    if (is_comm(in.op)) return advance_transfers(s);
    if (!reach_collective(s, in)) return false;
    double& t = now_[static_cast<size_t>(s)];
    const double d = duration_of(s, in, opt_);
    r_.timeline.push_back({s, in.op, in.mb, in.chunk, t, t + d});
    r_.busy[static_cast<size_t>(s)] += d;
    t += d;
    ++i;
    return true;
  }

  // The group (or lone send or receive) at pc[s]: its sends and receives posted once, then done
  // when every receive's data has arrived (and, with rendezvous sends, every send is matched).
  bool advance_transfers(int s) {
    const auto& list = lists_[static_cast<size_t>(s)];
    size_t& i = pc_[static_cast<size_t>(s)];
    double& t = now_[static_cast<size_t>(s)];
    const Instr& in = list[i];
    size_t end = i + 1;
    if (in.group >= 0)
      while (end < list.size() && list[end].group == in.group) ++end;
    bool moved = false;
    if (!posted_[static_cast<size_t>(s)]) {
      for (size_t k = i; k < end; ++k) post(s, list[k]);
      posted_[static_cast<size_t>(s)] = true;
      moved = true;
    }
    double ready = t;
    for (size_t k = i; k < end; ++k) {
      double a = 0.0;
      if (is_recv(list[k].op)) {
        if (!arrival(s, list[k], &a)) return moved;
      } else if (opt_.rendezvous_sends) {
        if (!matched(s, list[k], &a)) return moved;
      }
      ready = std::max(ready, a);
    }
    t = ready;
    i = end;
    posted_[static_cast<size_t>(s)] = false;
    return true;
  }

  // With opt.collectives, a ReduceGrads or OptimizerStep joins its collective: false while it
  // must wait for other stages, else true with the stage's time moved to when it completes.
  bool reach_collective(int s, const Instr& in) {
    const size_t i = pc_[static_cast<size_t>(s)];
    double& t = now_[static_cast<size_t>(s)];
    if (opt_.collectives && deferred_ && in.op == Op::kReduceGrads) {
      // 2bw posts batch b's collectives here and goes on.
      Collective& c = deferred_step(s, i, in.op);
      if (c.arrived.insert(s).second) c.ready = std::max(c.ready, t);
    } else if (opt_.collectives && deferred_ && in.op == Op::kOptimizerStep) {
      Collective& c = deferred_step(s, i, in.op);  // complete once every stage posted
      if (c.arrived.size() < c.members.size()) return false;
      t = std::max(t, c.ready);
    } else if (opt_.collectives && (in.op == Op::kReduceGrads || in.op == Op::kOptimizerStep)) {
      Collective& c = collective_at(s, i, in.op);
      if (!c.members.empty()) {  // empty: a middle stage's ReduceGrads, no collective there
        if (c.arrived.insert(s).second) c.ready = std::max(c.ready, t);
        if (c.arrived.size() < c.members.size()) return false;
        t = c.ready;
      }
    }
    return true;
  }

  // The transfer a stopped stage waits for: at pc, or in a group the first receive not yet
  // sent (with rendezvous sends: or send not yet received); the list's size when it finished.
  size_t waiting_transfer(int s) const {
    const auto& list = lists_[static_cast<size_t>(s)];
    const size_t i = pc_[static_cast<size_t>(s)];
    const int g = i < list.size() ? list[i].group : -1;
    for (size_t j = i; j < list.size() && (j == i || (g >= 0 && list[j].group == g)); ++j) {
      double a = 0.0;
      if (is_recv(list[j].op) && !arrival(s, list[j], &a)) return j;
      if (is_send(list[j].op) && opt_.rendezvous_sends && !matched(s, list[j], &a)) return j;
    }
    return i;
  }

  // Why stage s waits in the collective at instruction i: the stages that have not arrived.
  std::string collective_wait(int s, size_t i) {
    const auto& list = lists_[static_cast<size_t>(s)];
    const Collective& c =
        deferred_ ? deferred_step(s, i, list[i].op) : collective_at(s, i, list[i].op);
    std::string missing;
    for (int q : c.members)
      if (!c.arrived.count(q)) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    return "deadlock: " + at(s, i, list[i]) + " waits in the collective for stage(s) " + missing;
  }

  // Why stage s waits at transfer instruction k; *never: the other end is in no list.
  std::string transfer_wait(int s, size_t k, bool* never) {
    const Instr& in = lists_[static_cast<size_t>(s)][k];
    const bool sending = is_send(in.op);  // only with rendezvous sends
    const bool grad = in.op == Op::kRecvGrad || in.op == Op::kSendGrad;
    TransferKey key;
    const bool exists = transfer_of(s, in, p_, v_, &key);
    // The stage on the other end: the sender of a receive, the receiver of a send.
    const int peer = sending ? std::get<1>(key) : sender_of(s, in, p_, v_);
    *never = !exists || (sending ? transfers_[key].second : transfers_[key].first) == 0;
    std::string why = "deadlock: " + at(s, k, in) + " is blocked " + (sending ? "sending" : "on") +
                      " the " + (grad ? "gradient" : "activation") + " of " +
                      pair_name(in.mb, in.chunk);
    if (!exists || peer < 0) {
      why += sending ? ", which no stage can receive" : ", which no stage can send";
    } else if (*never) {
      why += ", which stage " + std::to_string(peer) +
             (sending ? " never receives (no such receive in its list)"
                      : " never sends (no such send in its list)");
    } else {
      why += ", which stage " + std::to_string(peer) +
             (sending ? " has not posted a receive for yet" : " has not sent yet");
      const auto& other = lists_[static_cast<size_t>(peer)];
      const size_t stuck = waiting_transfer(peer);
      if (stuck < other.size())
        why += " (it waits at instruction " + std::to_string(stuck) + ", " +
               instr_string(other[stuck]) + ")";
    }
    return why;
  }

  const ScheduleSpec& spec_;
  const std::vector<std::vector<Instr>>& lists_;
  const SimOptions& opt_;
  SimResult& r_;
  const int p_, v_;
  const bool deferred_;  // 2bw: ReduceGrads posts the step's collectives, the step completes them
  // Found before the run: transfers' send and receive counts, and the problems.
  std::map<TransferKey, std::pair<int, int>> transfers_;  // -> (sends, receives)
  std::vector<std::string> static_problems_;
  // The run's state.
  std::vector<size_t> pc_;                     // [stage] next instruction
  std::vector<double> now_;                    // [stage] its time
  std::vector<bool> posted_;                   // [stage] current group's sends are out
  std::map<TransferKey, double> sent_;         // transfer -> send time
  std::map<TransferKey, double> posted_recv_;  // transfer -> time its receive was posted
  std::map<std::tuple<Op, int>, Collective> collectives_;
};

}  // namespace

SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Instr>>& lists,
                   const SimOptions& opt) {
  SimResult r;
  if (static_cast<int>(lists.size()) != spec.stages) {
    r.problems.push_back(std::to_string(lists.size()) + " instruction lists for " +
                         std::to_string(spec.stages) + " stages");
    return r;
  }
  Simulation sim(spec, lists, opt, &r);
  sim.match_transfers();
  sim.check_stages();
  sim.run();
  sim.explain_stops();
  sim.summarize();
  return r;
}

SimResult simulate(const ScheduleSpec& spec, const SimOptions& opt) {
  return simulate(spec, build_all(spec), opt);
}

bool runs_on_rendezvous_sends(const ScheduleSpec& spec) {
  if (spec.kind == ScheduleKind::kTwoBW) return false;
  SimOptions o;
  o.rendezvous_sends = true;
  o.collectives = true;
  return simulate(spec, o).ok();
}

double theoretical_bubble_ratio(const ScheduleSpec& s) {
  const double p = s.stages, m = s.microbatches;
  switch (s.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      return (p - 1) / m;
    case ScheduleKind::kInterleaved:
      return (p - 1) / (s.chunks * m);
    case ScheduleKind::kTwoBW:
      return (p - 1) / (s.batches * m);
    case ScheduleKind::kZeroBubbleH1:
      return 2 * (p - 1) / (3 * m);
  }
  return 0.0;
}

double theoretical_bubble_fraction(const ScheduleSpec& s) {
  const double r = theoretical_bubble_ratio(s);
  return r / (1.0 + r);
}

std::string chrome_trace_json(const SimResult& r, double us_per_unit) {
  nlohmann::json events = nlohmann::json::array();
  int stages = 0;
  for (const TimelineEvent& e : r.timeline) stages = std::max(stages, e.stage + 1);
  stages = std::max(stages, static_cast<int>(r.busy.size()));
  for (int s = 0; s < stages; ++s)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", s},
                      {"args", {{"name", "stage " + std::to_string(s)}}}});
  for (const TimelineEvent& e : r.timeline) {
    Instr in;
    in.op = e.op;
    in.mb = e.mb;
    in.chunk = e.chunk;
    events.push_back({{"name", instr_string(in)},
                      {"cat", to_string(e.op)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", e.stage},
                      {"ts", e.start * us_per_unit},
                      {"dur", (e.end - e.start) * us_per_unit},
                      {"args", {{"mb", e.mb}, {"chunk", e.chunk}}}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump(1);
}

std::string text_diagram(const SimResult& r, int stages, int chunks) {
  auto label = [chunks](const TimelineEvent& e) {
    std::string tag;
    switch (e.op) {
      case Op::kForward:
        tag = "F";
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        tag = "B";
        break;
      case Op::kBackwardWeight:
        tag = "W";
        break;
      case Op::kReduceGrads:
        return std::string("R");
      case Op::kOptimizerStep:
        return std::string("S");
      default:
        return std::string("?");
    }
    tag += std::to_string(e.mb);
    if (chunks > 1) tag += "." + std::to_string(e.chunk);
    return tag;
  };
  const long slots = std::lround(r.makespan);
  // [stage][slot] label; "" idle, "-" continuation of a longer op.
  std::vector<std::vector<std::string>> grid(static_cast<size_t>(stages),
                                             std::vector<std::string>(static_cast<size_t>(slots)));
  size_t width = 1;
  for (const TimelineEvent& e : r.timeline) {
    const long a = std::lround(e.start), b = std::lround(e.end);
    if (b <= a || e.stage < 0 || e.stage >= stages) continue;  // zero-time steps not drawn
    const std::string l = label(e);
    width = std::max(width, l.size());
    for (long t = a; t < b && t < slots; ++t)
      grid[static_cast<size_t>(e.stage)][static_cast<size_t>(t)] = t == a ? l : "-";
  }
  std::ostringstream out;
  const std::string head = "stage ";
  const size_t stage_digits = std::to_string(std::max(stages - 1, 0)).size();
  for (int s = 0; s < stages; ++s) {
    std::string name = std::to_string(s);
    out << head << std::string(stage_digits - name.size(), ' ') << name << " |";
    std::string row;
    for (long t = 0; t < slots; ++t) {
      std::string cell = grid[static_cast<size_t>(s)][static_cast<size_t>(t)];
      if (cell.empty()) cell = ".";
      row += ' ' + cell + std::string(width - cell.size(), ' ');
    }
    row.erase(row.find_last_not_of(' ') + 1);
    out << row << '\n';
  }
  return out.str();
}

}  // namespace strata
