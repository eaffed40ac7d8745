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

// The per-stage checks of simulator.h; appends to `problems`.
StageFacts check_stage(const ScheduleSpec& spec, int stage, const std::vector<Instr>& list,
                       std::vector<std::string>* problems) {
  const int p = spec.stages, v = spec.chunks, m = spec.microbatches;
  const int n_mb = m * spec.batches;
  auto bad = [&](const std::string& what) { problems->push_back(what); };
  std::vector<PairPos> pairs(static_cast<size_t>(n_mb * v));  // [mb * v + chunk]
  std::vector<int> reduces, steps, switches;
  std::map<int, std::pair<int, int>> groups;  // group -> (first index, count)

  for (size_t idx = 0; idx < list.size(); ++idx) {
    const Instr& in = list[idx];
    const int pos = static_cast<int>(idx);
    if (in.group >= 0) {
      if (!is_comm(in.op))
        bad(at(stage, idx, in) + " is in group " + std::to_string(in.group) +
            " but groups hold only sends and receives");
      auto it = groups.find(in.group);
      if (it == groups.end()) {
        groups[in.group] = {pos, 1};
      } else {
        if (it->second.first + it->second.second != pos)
          bad(at(stage, idx, in) + ": group " + std::to_string(in.group) +
              " is not one contiguous run");
        ++it->second.second;
      }
    }
    if (in.op == Op::kReduceGrads) {
      reduces.push_back(pos);
      continue;
    }
    if (in.op == Op::kOptimizerStep) {
      steps.push_back(pos);
      continue;
    }
    if (in.op == Op::kSwitchWeights) {
      switches.push_back(pos);
      continue;
    }
    if (in.mb < 0 || in.mb >= n_mb || in.chunk < 0 || in.chunk >= v) {
      bad(at(stage, idx, in) + " names " + pair_name(in.mb, in.chunk) + ", outside " +
          std::to_string(n_mb) + " micro-batches x " + std::to_string(v) + " chunks");
      continue;
    }
    PairPos& pp = pairs[static_cast<size_t>(in.mb * v + in.chunk)];
    auto set_once = [&](int* slot, const char* what) {
      if (*slot >= 0)
        bad(at(stage, idx, in) + ": " + what + " of " + pair_name(in.mb, in.chunk) +
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

  const std::string st = "stage " + std::to_string(stage) + ": ";
  for (int mb = 0; mb < n_mb; ++mb) {
    for (int c = 0; c < v; ++c) {
      const PairPos& pp = pairs[static_cast<size_t>(mb * v + c)];
      const std::string name = pair_name(mb, c);
      const bool has_prev = prev_piece(stage, c, p, v).stage >= 0;
      const bool has_next = next_piece(stage, c, p, v).stage >= 0;
      if (pp.f < 0) bad(st + name + " is never forwarded");
      if (pp.b < 0) bad(st + name + " is never backwarded");
      if (pp.split && pp.w < 0) bad(st + name + " gets a backward-input pass but no weight pass");
      if (!pp.split && pp.w >= 0) bad(st + name + " gets a weight pass after a full backward");
      if (pp.f >= 0 && pp.b >= 0 && pp.b < pp.f) bad(st + name + " is backwarded before forward");
      if (pp.b >= 0 && pp.w >= 0 && pp.w < pp.b)
        bad(st + name + " gets its weight pass before its backward-input pass");
      // Data the forward and backward need must be received before them and what they
      // produce sent after them; a piece at an end of the model neither receives nor sends.
      if (has_prev) {
        if (pp.ra < 0)
          bad(st + name + ": the forward's input is never received");
        else if (pp.f >= 0 && pp.ra > pp.f)
          bad(st + name + ": input received after the forward");
        if (pp.sg < 0)
          bad(st + name + ": the input gradient is never sent");
        else if (pp.b >= 0 && pp.sg < pp.b)
          bad(st + name + ": input gradient sent before the backward");
      } else {
        if (pp.ra >= 0) bad(st + name + ": receives an input though it is the first piece");
        if (pp.sg >= 0) bad(st + name + ": sends an input gradient though it is the first piece");
      }
      if (has_next) {
        if (pp.sa < 0)
          bad(st + name + ": the forward's output is never sent");
        else if (pp.f >= 0 && pp.sa < pp.f)
          bad(st + name + ": output sent before the forward");
        if (pp.rg < 0)
          bad(st + name + ": the output gradient is never received");
        else if (pp.b >= 0 && pp.rg > pp.b)
          bad(st + name + ": output gradient received after the backward");
      } else {
        if (pp.sa >= 0) bad(st + name + ": sends an output though it is the last piece");
        if (pp.rg >= 0)
          bad(st + name + ": receives an output gradient though it is the last piece");
      }
    }
  }

  // One reduce and one step per batch, after every backward of that batch.
  const int n = spec.batches;
  const bool two_bw = spec.kind == ScheduleKind::kTwoBW;
  if (static_cast<int>(reduces.size()) != n || static_cast<int>(steps.size()) != n) {
    bad(st + std::to_string(reduces.size()) + " ReduceGrads and " + std::to_string(steps.size()) +
        " OptimizerStep for " + std::to_string(n) + " batch(es); expected one each per batch");
  } else {
    for (int j = 0; j < n; ++j) {
      if (steps[static_cast<size_t>(j)] < reduces[static_cast<size_t>(j)])
        bad(st + "the optimizer step of batch " + std::to_string(j) + " precedes its ReduceGrads");
      int last_backward = -1;
      for (int mb = j * m; mb < (j + 1) * m; ++mb)
        for (int c = 0; c < v; ++c) {
          const PairPos& pp = pairs[static_cast<size_t>(mb * v + c)];
          last_backward = std::max({last_backward, pp.b, pp.w});
        }
      if (last_backward > reduces[static_cast<size_t>(j)])
        bad(st + "ReduceGrads of batch " + std::to_string(j) +
            " comes before all of that batch's backwards");
    }
  }
  if (!two_bw && !switches.empty()) bad(st + "SwitchWeights in a schedule that is not 2bw");
  if (two_bw) {
    if (static_cast<int>(switches.size()) != n) {
      bad(st + std::to_string(switches.size()) + " SwitchWeights for " + std::to_string(n) +
          " batch(es); 2bw switches once per batch");
    } else if (static_cast<int>(steps.size()) == n) {
      for (int j = 0; j < n; ++j)
        if (switches[static_cast<size_t>(j)] < steps[static_cast<size_t>(j)])
          bad(st + "SwitchWeights of batch " + std::to_string(j) + " precedes its optimizer step");
      // The step of batch j reads its gradient buffer and reduction, which batch j+1 takes
      // over with the backward of its last micro-batch.
      for (int j = 0; j + 1 < n; ++j) {
        int last_backward = -1;
        for (int mb = (j + 1) * m; mb < (j + 2) * m; ++mb)
          for (int c = 0; c < v; ++c) {
            const PairPos& pp = pairs[static_cast<size_t>(mb * v + c)];
            last_backward = std::max({last_backward, pp.b, pp.w});
          }
        if (last_backward >= 0 && last_backward < steps[static_cast<size_t>(j)])
          bad(st + "the optimizer step of batch " + std::to_string(j) +
              " comes after the last backward of batch " + std::to_string(j + 1));
      }
      // Batch b >= 2 runs on W(b-1), which exists only from the switch of batch b-2 on.
      for (int b = 2; b < n; ++b)
        for (int mb = b * m; mb < (b + 1) * m; ++mb)
          for (int c = 0; c < v; ++c) {
            const PairPos& pp = pairs[static_cast<size_t>(mb * v + c)];
            if (pp.f >= 0 && pp.f < switches[static_cast<size_t>(b - 2)])
              bad(st + "forward of " + pair_name(mb, c) + " (batch " + std::to_string(b) +
                  ") before the weight switch of batch " + std::to_string(b - 2));
          }
    }
  }

  // Peak in-flight pairs (forward to end of backward) and weight versions, walking the list.
  StageFacts facts;
  int inflight = 0, newest = 0;
  std::vector<int> finished(static_cast<size_t>(n), 0);  // [batch] pairs done
  std::set<int> open;  // batches started and not finished on this stage
  for (const Instr& in : list) {
    if (in.op == Op::kOptimizerStep) ++newest;
    if (in.mb >= 0 && in.mb < n_mb && in.chunk >= 0 && in.chunk < v) {
      const PairPos& pp = pairs[static_cast<size_t>(in.mb * v + in.chunk)];
      const int batch = in.mb / m;
      if (in.op == Op::kForward) {
        ++inflight;
        open.insert(batch);
      }
      const bool ends = pp.split ? in.op == Op::kBackwardWeight : in.op == Op::kBackward;
      if (ends) {
        --inflight;
        if (++finished[static_cast<size_t>(batch)] == m * v) open.erase(batch);
      }
    }
    facts.peak_inflight = std::max(facts.peak_inflight, inflight);
    // Batch b runs on version max(b-1, 0); the newest version is kept for batches to come.
    std::set<int> versions = {newest};
    for (int b : open) versions.insert(std::max(b - 1, 0));
    facts.peak_versions = std::max(facts.peak_versions, static_cast<int>(versions.size()));
  }
  if (two_bw && facts.peak_versions > 2)
    bad(st + "needs " + std::to_string(facts.peak_versions) +
        " weight versions at once; 2bw holds two");
  return facts;
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

}  // namespace

SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Instr>>& lists,
                   const SimOptions& opt) {
  SimResult r;
  const int p = spec.stages, v = spec.chunks;
  if (static_cast<int>(lists.size()) != p) {
    r.problems.push_back(std::to_string(lists.size()) + " instruction lists for " +
                         std::to_string(p) + " stages");
    return r;
  }

  // Cross-stage matching: each transfer sent exactly once and received exactly once.
  std::vector<std::string> static_problems;
  std::map<TransferKey, std::pair<int, int>> transfers;     // -> (sends, receives)
  std::map<TransferKey, std::pair<int, size_t>> first_use;  // -> (stage, index) for messages
  for (int s = 0; s < p; ++s) {
    const auto& list = lists[static_cast<size_t>(s)];
    for (size_t idx = 0; idx < list.size(); ++idx) {
      const Instr& in = list[idx];
      if (!is_comm(in.op)) continue;
      TransferKey key;
      if (!transfer_of(s, in, p, v, &key)) {
        static_problems.push_back(at(s, idx, in) +
                                  (is_send(in.op) ? " sends past" : " receives from past") +
                                  " the end of the model");
        continue;
      }
      auto& counts = transfers[key];
      (is_send(in.op) ? counts.first : counts.second) += 1;
      first_use.emplace(key, std::make_pair(s, idx));
    }
  }
  for (const auto& [key, counts] : transfers) {
    if (counts.first == 1 && counts.second == 1) continue;
    const auto& [is_grad, to_stage, mb, chunk] = key;
    const auto& [s, idx] = first_use[key];
    static_problems.push_back(
        std::string(is_grad ? "gradient" : "activation") + " of " + pair_name(mb, chunk) +
        " for stage " + std::to_string(to_stage) + " is sent " + std::to_string(counts.first) +
        " time(s) and received " + std::to_string(counts.second) + " time(s) (first at " +
        at(s, idx, lists[static_cast<size_t>(s)][idx]) + "); each needs exactly one of each");
  }
  r.peak_inflight.assign(static_cast<size_t>(p), 0);
  r.peak_weight_versions.assign(static_cast<size_t>(p), 0);
  for (int s = 0; s < p; ++s) {
    const StageFacts f = check_stage(spec, s, lists[static_cast<size_t>(s)], &static_problems);
    r.peak_inflight[static_cast<size_t>(s)] = f.peak_inflight;
    r.peak_weight_versions[static_cast<size_t>(s)] = f.peak_versions;
  }

  // Event-driven run. Each stage advances as far as it can; a pass over all stages that
  // moves none of them means every unfinished stage waits for a send that cannot come.
  // Times are a pure function of the lists and durations (each instruction starts when the
  // stage and its data are ready), so the order in which stages are visited does not matter.
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> now(static_cast<size_t>(p), 0.0);
  std::vector<bool> posted(static_cast<size_t>(p), false);  // current group's sends are out
  r.busy.assign(static_cast<size_t>(p), 0.0);
  std::map<TransferKey, double> sent;         // transfer -> send time
  std::map<TransferKey, double> posted_recv;  // transfer -> time its receive was posted
  auto post = [&](int s, const Instr& in) {
    TransferKey key;
    if (!transfer_of(s, in, p, v, &key)) return;
    (is_send(in.op) ? sent : posted_recv).emplace(key, now[static_cast<size_t>(s)]);
  };
  // With rendezvous sends, when the receive matching a send was posted; false until then.
  auto matched = [&](int s, const Instr& in, double* t) {
    TransferKey key;
    if (!transfer_of(s, in, p, v, &key)) return false;
    auto it = posted_recv.find(key);
    if (it == posted_recv.end()) return false;
    *t = it->second;
    return true;
  };
  // Arrival time of what a receive waits for; false while it has not been sent.
  auto arrival = [&](int s, const Instr& in, double* t) {
    TransferKey key;
    if (!transfer_of(s, in, p, v, &key)) return false;
    auto it = sent.find(key);
    if (it == sent.end()) return false;
    double start = it->second;
    if (opt.transfer_at_receive) {
      auto posted_at = posted_recv.find(key);
      if (posted_at != posted_recv.end()) start = std::max(start, posted_at->second);
    }
    *t = start + opt.latency;
    return true;
  };
  // Collectives (opt.collectives): batch b's ReduceGrads of the first and last stage, and its
  // OptimizerStep of every stage, each the k-th of its kind in the stage's list.
  struct Collective {
    std::set<int> members;  // the stages it reduces over
    std::set<int> arrived;
    double ready = 0.0;  // when the last member arrived
  };
  std::map<std::tuple<Op, int>, Collective> collectives;
  auto collective_at = [&](int s, size_t i, Op op) -> Collective& {
    const auto& list = lists[static_cast<size_t>(s)];
    int batch = 0;
    for (size_t k = 0; k < i; ++k) batch += list[k].op == op ? 1 : 0;
    Collective& c = collectives[{op, batch}];
    if (op == Op::kOptimizerStep) {
      for (int q = 0; q < p; ++q) c.members.insert(q);
    } else if (p > 1 && (s == 0 || s == p - 1)) {
      c.members = {0, p - 1};
    }
    return c;
  };
  // 2bw: batch b's ReduceGrads only posts its collectives (the tied embedding's and the gradient
  // norm's sums, over every stage) and its OptimizerStep waits for them: one collective per
  // batch, arrived at by each stage's ReduceGrads, completed at its OptimizerStep.
  const bool deferred = spec.kind == ScheduleKind::kTwoBW;
  auto deferred_step = [&](int s, size_t i, Op op) -> Collective& {
    const auto& list = lists[static_cast<size_t>(s)];
    int batch = 0;
    for (size_t k = 0; k < i; ++k) batch += list[k].op == op ? 1 : 0;
    Collective& c = collectives[{Op::kReduceGrads, batch}];
    for (int q = 0; q < p; ++q) c.members.insert(q);
    return c;
  };
  // Runs the instruction (or group) at pc[s]; false when it must wait.
  auto advance = [&](int s) -> bool {
    const auto& list = lists[static_cast<size_t>(s)];
    size_t& i = pc[static_cast<size_t>(s)];
    double& t = now[static_cast<size_t>(s)];
    if (i >= list.size()) return false;
    const Instr& in = list[i];
    if (is_comm(in.op)) {
      size_t end = i + 1;
      if (in.group >= 0)
        while (end < list.size() && list[end].group == in.group) ++end;
      bool moved = false;
      if (!posted[static_cast<size_t>(s)]) {
        for (size_t k = i; k < end; ++k) post(s, list[k]);
        posted[static_cast<size_t>(s)] = true;
        moved = true;
      }
      double ready = t;
      for (size_t k = i; k < end; ++k) {
        double a = 0.0;
        if (is_recv(list[k].op)) {
          if (!arrival(s, list[k], &a)) return moved;
        } else if (opt.rendezvous_sends) {
          if (!matched(s, list[k], &a)) return moved;
        }
        ready = std::max(ready, a);
      }
      t = ready;
      i = end;
      posted[static_cast<size_t>(s)] = false;
      return true;
    }
    if (opt.collectives && deferred && in.op == Op::kReduceGrads) {
      // 2bw posts batch b's collectives here and goes on.
      Collective& c = deferred_step(s, i, in.op);
      if (c.arrived.insert(s).second) c.ready = std::max(c.ready, t);
    } else if (opt.collectives && deferred && in.op == Op::kOptimizerStep) {
      Collective& c = deferred_step(s, i, in.op);  // complete once every stage posted
      if (c.arrived.size() < c.members.size()) return false;
      t = std::max(t, c.ready);
    } else if (opt.collectives && (in.op == Op::kReduceGrads || in.op == Op::kOptimizerStep)) {
      Collective& c = collective_at(s, i, in.op);
      if (!c.members.empty()) {  // empty: a middle stage's ReduceGrads, no collective there
        if (c.arrived.insert(s).second) c.ready = std::max(c.ready, t);
        if (c.arrived.size() < c.members.size()) return false;
        t = c.ready;
      }
    }
    const double d = duration_of(s, in, opt);
    r.timeline.push_back({s, in.op, in.mb, in.chunk, t, t + d});
    r.busy[static_cast<size_t>(s)] += d;
    t += d;
    ++i;
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s)
      while (advance(s)) progress = true;
  }

  // The transfer a stopped stage waits for: at pc, or in a group the first receive not yet
  // sent (with rendezvous sends: or send not yet received); the list's size when it finished.
  auto waiting_transfer = [&](int s) {
    const auto& list = lists[static_cast<size_t>(s)];
    const size_t i = pc[static_cast<size_t>(s)];
    const int g = i < list.size() ? list[i].group : -1;
    for (size_t j = i; j < list.size() && (j == i || (g >= 0 && list[j].group == g)); ++j) {
      double a = 0.0;
      if (is_recv(list[j].op) && !arrival(s, list[j], &a)) return j;
      if (is_send(list[j].op) && opt.rendezvous_sends && !matched(s, list[j], &a)) return j;
    }
    return i;
  };
  r.finished = true;
  r.blocked_at.assign(static_cast<size_t>(p), -1);
  std::vector<std::string> deadlock;
  size_t root_causes = 0;
  for (int s = 0; s < p; ++s) {
    const auto& list = lists[static_cast<size_t>(s)];
    const size_t i = pc[static_cast<size_t>(s)];
    if (i >= list.size()) continue;
    r.finished = false;
    if (opt.collectives && !is_comm(list[i].op)) {  // stopped at a collective
      r.blocked_at[static_cast<size_t>(s)] = static_cast<int>(i);
      const Collective& c =
          deferred ? deferred_step(s, i, list[i].op) : collective_at(s, i, list[i].op);
      std::string missing;
      for (int q : c.members)
        if (!c.arrived.count(q)) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      deadlock.push_back("deadlock: " + at(s, i, list[i]) +
                         " waits in the collective for stage(s) " + missing);
      continue;
    }
    const size_t k = waiting_transfer(s);
    r.blocked_at[static_cast<size_t>(s)] = static_cast<int>(k);
    const Instr& in = list[k];
    const bool sending = is_send(in.op);  // only with rendezvous sends
    const bool grad = in.op == Op::kRecvGrad || in.op == Op::kSendGrad;
    TransferKey key;
    const bool exists = transfer_of(s, in, p, v, &key);
    // The stage on the other end: the sender of a receive, the receiver of a send.
    const int peer = sending ? std::get<1>(key) : sender_of(s, in, p, v);
    const bool never = !exists || (sending ? transfers[key].second : transfers[key].first) == 0;
    std::string why = "deadlock: " + at(s, k, in) + " is blocked " + (sending ? "sending" : "on") +
                      " the " + (grad ? "gradient" : "activation") + " of " +
                      pair_name(in.mb, in.chunk);
    if (!exists || peer < 0) {
      why += sending ? ", which no stage can receive" : ", which no stage can send";
    } else if (never) {
      why += ", which stage " + std::to_string(peer) +
             (sending ? " never receives (no such receive in its list)"
                      : " never sends (no such send in its list)");
    } else {
      why += ", which stage " + std::to_string(peer) +
             (sending ? " has not posted a receive for yet" : " has not sent yet");
      const auto& other = lists[static_cast<size_t>(peer)];
      const size_t stuck = waiting_transfer(peer);
      if (stuck < other.size())
        why += " (it waits at instruction " + std::to_string(stuck) + ", " +
               instr_string(other[stuck]) + ")";
    }
    // A transfer whose other end exists nowhere is the cause; the stages waiting on stages
    // that wait are its consequences, so causes are listed first.
    deadlock.insert(never ? deadlock.begin() + static_cast<long>(root_causes++) : deadlock.end(),
                    why);
  }
  r.problems = deadlock;
  r.problems.insert(r.problems.end(), static_problems.begin(), static_problems.end());

  for (double t : now) r.makespan = std::max(r.makespan, t);
  double busy = 0.0;
  for (double b : r.busy) busy += b;
  const double total = r.makespan * p;
  if (total > 0.0) r.bubble_fraction = 1.0 - busy / total;
  if (busy > 0.0) r.bubble_ratio = (total - busy) / busy;
  std::stable_sort(r.timeline.begin(), r.timeline.end(),
                   [](const TimelineEvent& a, const TimelineEvent& b) {
                     return std::tie(a.start, a.stage) < std::tie(b.start, b.stage);
                   });
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
