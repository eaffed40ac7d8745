// simulator.cc — simulates instruction lists (simulator.h), after matching their transfers
// across stages and checking each stage (stage_checker.cc); the timeline outputs are
// timeline_output.cc.
#include "schedules/simulator.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "schedules/simulator_internal.h"

namespace strata {
namespace {

using namespace sim_internal;

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

  // The per-stage checks (stage_checker.cc), and each stage's peaks.
  void check_stages() {
    r_.peak_inflight.assign(static_cast<size_t>(p_), 0);
    r_.peak_weight_versions.assign(static_cast<size_t>(p_), 0);
    for (int s = 0; s < p_; ++s) {
      const StageFacts f = check_stage(spec_, s, lists_[static_cast<size_t>(s)], &static_problems_);
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

}  // namespace strata
