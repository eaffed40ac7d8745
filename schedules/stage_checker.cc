// stage_checker.cc — the per-stage checks of simulator.h (simulator_internal.h's check_stage):
// one stage's list indexed, then each (micro-batch, chunk) pair's order and transfers, each
// batch's ReduceGrads and OptimizerStep, 2bw's weight switches, and the peaks it reaches.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "schedules/simulator_internal.h"

namespace strata::sim_internal {
namespace {

// Positions (list indices) of the instructions touching one (mb, chunk) on one stage.
struct PairPos {
  int f = -1, b = -1, w = -1;  // forward, backward or backward-input, backward-weight
  int ra = -1, sa = -1;        // receive input, send output
  int rg = -1, sg = -1;        // receive output gradient, send input gradient
  bool split = false;          // backward is a backward-input pass (W comes separately)
};

// The checks in the order their problems are reported: the list indexed (groups, and each (mb,
// chunk)'s instructions once each), every pair's order and transfers, each batch's ReduceGrads and
// OptimizerStep, 2bw's weight switches, then the peaks the list reaches.
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

}  // namespace

StageFacts check_stage(const ScheduleSpec& spec, int stage, const std::vector<Instr>& list,
                       std::vector<std::string>* problems) {
  return StageChecker(spec, stage, list, problems).run();
}

}  // namespace strata::sim_internal
