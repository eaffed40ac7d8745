// schedule.cc — the five pipeline schedules as instruction lists (see schedule.h).
//
// Every schedule is built in two steps:
//   1. a compute order: the stage's forwards, backwards (or backward-input / backward-weight
//      passes), gradient reductions, optimizer steps and weight switches, in the order the stage
//      runs them; this is where the schedules differ;
//   2. with_communication(): the same for all schedules, over the order cut into rounds. The
//      one-chunk schedules have one compute step per round: each forward is preceded by the
//      receive of its input and followed by the send of its output, each backward (zero-bubble:
//      each backward-input pass) by the receive of its output gradient and the send of its
//      input gradient, wherever the neighbouring model piece exists. The communication between
//      two compute steps forms one group (sends first, then receives): with 1F1B this is
//      exactly Megatron's send_forward_recv_backward / send_backward_recv_forward pairing.
//      Interleaved's rounds are a forward and a backward (receives a round ahead, as
//      Megatron's), which NCCL's rendezvous sends need there; the argument below holds for it
//      as well, since a receive posted early only waits for data the next round needs anyway.
//
// Why receives sit immediately before the op that consumes them and sends immediately after the
// op that produces them: with non-blocking sends, a stage then never waits for anything but
// the data its next compute step needs, so the lists add no dependency beyond the model's own
// data flow and the compute order. A compute order in which every backward follows its forward
// and the stages agree (the checker proves it, simulator.h) therefore cannot deadlock however
// the stages interleave in time.
#include "schedules/schedule.h"

#include <algorithm>
#include <string>
#include <vector>

namespace strata {
namespace {

// One compute step of a stage's order (no communication yet).
struct Step {
  Op op;
  int mb;
  int chunk;
};

bool is_comm(Op op) {
  return op == Op::kRecvActivation || op == Op::kSendActivation || op == Op::kRecvGrad ||
         op == Op::kSendGrad;
}

// Numbers the groups: a run of two or more communication instructions between two compute
// steps is one group, a lone one stays ungrouped (-1).
void number_groups(std::vector<Instr>* list) {
  std::vector<Instr>& out = *list;
  int next_group = 0;
  for (size_t i = 0; i < out.size();) {
    size_t j = i;
    while (j < out.size() && is_comm(out[j].op)) ++j;
    if (j - i >= 2) {
      for (size_t k = i; k < j; ++k) out[k].group = next_group;
      ++next_group;
    }
    i = (j == i) ? i + 1 : j;
  }
}

// Adds the sends and receives to a compute order cut into rounds (see the file comment): each
// round's receives, then the round, then its sends. With one compute step per round this puts
// every receive right before the op that consumes it and every send right after the op that
// produces it; the communication between two rounds (the sends of one and the receives of the
// next) forms one group.
//
// Interleaved's rounds are Megatron's (a warm-up forward, a steady-state forward/backward
// pair, a cool-down backward): one batch per round boundary carries the round's sends and the
// next round's receives (send_forward_backward_recv_forward_backward). Every stage then posts
// the same kind of batch at each boundary, so with rendezvous sends (NCCL) a batch's sends meet
// receives their peers post in a batch of their own at about the same point, where one-step
// rounds left two stages each sending to the other first; tests/test_schedules.cc checks every
// (p, m, v) both ways.
std::vector<Instr> with_communication(const std::vector<std::vector<Step>>& rounds, int stage,
                                      int p, int v) {
  std::vector<Instr> out;
  auto push = [&](Op op, int mb, int chunk) {
    Instr i;
    i.op = op;
    i.mb = mb;
    i.chunk = chunk;
    out.push_back(i);
  };
  // Zero-bubble's backward-input pass moves gradients as a full backward does.
  auto backward = [](Op op) { return op == Op::kBackward || op == Op::kBackwardInput; };
  auto receives = [&](const std::vector<Step>& round) {
    for (const Step& s : round) {
      if (s.op == Op::kForward && prev_piece(stage, s.chunk, p, v).stage >= 0)
        push(Op::kRecvActivation, s.mb, s.chunk);
      if (backward(s.op) && next_piece(stage, s.chunk, p, v).stage >= 0)
        push(Op::kRecvGrad, s.mb, s.chunk);
    }
  };
  auto sends = [&](const std::vector<Step>& round) {
    for (const Step& s : round) {
      if (s.op == Op::kForward && next_piece(stage, s.chunk, p, v).stage >= 0)
        push(Op::kSendActivation, s.mb, s.chunk);
      if (backward(s.op) && prev_piece(stage, s.chunk, p, v).stage >= 0)
        push(Op::kSendGrad, s.mb, s.chunk);
    }
  };
  if (!rounds.empty()) receives(rounds.front());
  for (size_t r = 0; r < rounds.size(); ++r) {
    for (const Step& s : rounds[r]) push(s.op, s.mb, s.chunk);
    sends(rounds[r]);
    if (r + 1 < rounds.size()) receives(rounds[r + 1]);
  }
  number_groups(&out);
  return out;
}

// One round per compute step: the just-in-time transfers of the one-chunk schedules.
std::vector<std::vector<Step>> one_step_rounds(const std::vector<Step>& order) {
  std::vector<std::vector<Step>> rounds;
  rounds.reserve(order.size());
  for (const Step& s : order) rounds.push_back({s});
  return rounds;
}

// The one-forward-one-backward order over micro-batches 0..n-1 of chunk 0: `warmup` forwards,
// then forward(warmup+i) / backward(i) pairs, then the remaining backwards. split_backward:
// each backward is a backward-input pass followed at once by its weight pass (order_zb_h1 says
// why at once). after_backward(mb, out) may append steps after the backward of mb (2bw's
// optimizer step).
template <class AfterBackward>
void order_1f1b(int n, int warmup, bool split_backward, std::vector<Step>* out,
                AfterBackward after_backward) {
  auto backward = [&](int mb) {
    if (split_backward) {
      out->push_back({Op::kBackwardInput, mb, 0});
      out->push_back({Op::kBackwardWeight, mb, 0});
    } else {
      out->push_back({Op::kBackward, mb, 0});
    }
    after_backward(mb, out);
  };
  for (int i = 0; i < warmup; ++i) out->push_back({Op::kForward, i, 0});
  for (int i = 0; i < n - warmup; ++i) {
    out->push_back({Op::kForward, warmup + i, 0});
    backward(i);
  }
  for (int i = n - warmup; i < n; ++i) backward(i);
}

void append_flush_step(std::vector<Step>* out) {
  out->push_back({Op::kReduceGrads, -1, 0});
  out->push_back({Op::kOptimizerStep, -1, 0});
}

// GPipe: all forwards, then all backwards in the same order 0..m-1 (Megatron's and GPipe's
// order; it also accumulates the gradients in the order 1f1b does).
std::vector<Step> order_gpipe(const ScheduleSpec& s) {
  std::vector<Step> out;
  for (int mb = 0; mb < s.microbatches; ++mb) out.push_back({Op::kForward, mb, 0});
  for (int mb = 0; mb < s.microbatches; ++mb) out.push_back({Op::kBackward, mb, 0});
  append_flush_step(&out);
  return out;
}

// 1F1B (PipeDream-Flush): warm-up min(p - stage - 1, m) forwards, so stage `stage` holds at
// most p - stage micro-batches' activations.
std::vector<Step> order_1f1b_flush(const ScheduleSpec& s, int stage, bool split_backward) {
  std::vector<Step> out;
  const int warmup = std::min(s.stages - stage - 1, s.microbatches);
  order_1f1b(s.microbatches, warmup, split_backward, &out, [](int, std::vector<Step>*) {});
  append_flush_step(&out);
  return out;
}

// Zero-bubble H1 with the per-stage memory of 1f1b. Stage `stage` may hold p - stage
// micro-batches from forward to weight pass (1f1b's count from forward to backward), so
// after the warm-up it must run the weight pass of micro-batch i before the forward of
// w + i + 1: the steady state is F(w+i) B(i) W(i) and the cool-down B(j) W(j), the weight
// passes filling the gaps in which 1f1b's cool-down waits for gradients. Only B is on the
// critical path of the gradient chain, which cuts the bubble from (p-1)(F+B+W) to
// (p-1)(F+B) per stage; with F = B = W that is 2(p-1)/(3m) against 1f1b's (p-1)/m.
// The last stage may hold one micro-batch, so it runs F B W in lock-step and no order under
// this memory bound does better (docs/schedules.md). The paper's ZB-H1 instead lets every
// stage hold p micro-batches (same peak as 1f1b over all stages, not on each) and reaches
// (p-1)/(3m).
std::vector<Step> order_zb_h1(const ScheduleSpec& s, int stage) {
  return order_1f1b_flush(s, stage, /*split_backward=*/true);
}

// PipeDream-2BW: one 1F1B pipeline over all batches·m micro-batches (numbered globally, batch
// = mb / m) with no flush between batches. Batch j's gradient, computed on W(max(j-1, 0)),
// makes W(j+1) = W(j) - update(grad), the version of batch j+2 and later:
//   - ReduceGrads follows the backward of the last micro-batch of batch j (and the send of its
//     input gradient): every backward of batch j on this stage is done, and what the update
//     needs from other stages and ranks (the tied embedding's gradient sum, the data-parallel
//     reduction, the global gradient norm, the loss) is started there, without waiting;
//   - OptimizerStep and SwitchWeights come as late as they may: just before the first forward
//     of batch j+2 (the first use of W(j+1)) or the backward of the last micro-batch of batch
//     j+1 (whose gradients start the next reduction), whichever comes first — at the end for
//     the last batches. Until then batch j+1 runs on W(j) and accumulates its gradients in a
//     second buffer, so the collectives of batch j complete while the pipeline keeps running
//     and no stage waits for another at a batch boundary (docs/schedules.md).
// W(j+1) goes into the buffer of W(j-1), which no micro-batch uses once batch j's backwards
// are done: two versions are held, W(j) and W(j+1).
// The warm-up is capped at m so that no forward of batch j+2 runs on this stage before the
// step of batch j (stage 0 would otherwise need a third version when m < p - 1).
std::vector<Step> order_2bw(const ScheduleSpec& s, int stage) {
  std::vector<Step> order;
  const int m = s.microbatches;
  const int total = m * s.batches;
  const int warmup = std::min(s.stages - stage - 1, m);
  order_1f1b(total, warmup, false, &order, [m](int mb, std::vector<Step>* o) {
    if ((mb + 1) % m == 0) o->push_back({Op::kReduceGrads, -1, 0});
  });
  std::vector<Step> out;
  out.reserve(order.size() + 2 * static_cast<size_t>(s.batches));
  int steps = 0;  // batches whose step is placed
  auto place_steps_before = [&](const Step& next) {
    // The step of batch j goes before Forward((j+2)m) and before Backward((j+2)m - 1).
    while (steps < s.batches && ((next.op == Op::kForward && next.mb >= (steps + 2) * m) ||
                                 (next.op == Op::kBackward && next.mb >= (steps + 2) * m - 1))) {
      out.push_back({Op::kOptimizerStep, -1, 0});
      out.push_back({Op::kSwitchWeights, -1, 0});
      ++steps;
    }
  };
  for (const Step& st : order) {
    place_steps_before(st);
    out.push_back(st);
  }
  for (; steps < s.batches; ++steps) {
    out.push_back({Op::kOptimizerStep, -1, 0});
    out.push_back({Op::kSwitchWeights, -1, 0});
  }
  return out;
}

// Megatron's micro-batch groups for the interleaved schedule: a stage runs a group of N
// micro-batches through chunk 0, then the same group through chunk 1, ..., then the next group.
// A forward of (mb, c+1) on stage 0 needs (mb, c) to have passed all p stages, so each group
// must hold at least p micro-batches; Megatron's default N = p then needs m % p == 0. We take
// the smallest N >= p for which the micro-batches cut into groups of N, the last one holding
// the remainder m % N when that is not 0, with every group >= p (N = m always qualifies).
// The first group is the largest, which the warm-up below relies on. Returns group sizes.
std::vector<int> interleaved_groups(int m, int p) {
  int n = p;
  while (!(m % n == 0 || m % n >= p)) ++n;
  std::vector<int> sizes(static_cast<size_t>(m / n), n);
  if (m % n != 0) sizes.push_back(m % n);
  return sizes;
}

// Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving). The forward
// order is the group table above ("virtual micro-batches" k = 0 .. m·v-1); the backward order
// is the same table with the chunks reversed (v-1-c), since gradients enter at the last
// chunk. Warm-up: 2(p - stage - 1) + (v - 1)·N forwards, N the first group's size: the
// (v - 1)·N forwards bring micro-batch 0 to the last chunk on the last stage, and 2 per stage
// downstream cover the round trip of the first gradient. Then forward(k + warmup) /
// backward(k) pairs and a cool-down of backwards.
std::vector<std::vector<Step>> rounds_interleaved(const ScheduleSpec& s, int stage) {
  const int p = s.stages, m = s.microbatches, v = s.chunks;
  const std::vector<int> groups = interleaved_groups(m, p);
  std::vector<Step> table;  // [virtual micro-batch] (mb, chunk) in forward order
  table.reserve(static_cast<size_t>(m * v));
  int first = 0;
  for (int size : groups) {
    for (int c = 0; c < v; ++c)
      for (int mb = first; mb < first + size; ++mb) table.push_back({Op::kForward, mb, c});
    first += size;
  }
  const int total = m * v;
  const int warmup = std::min(2 * (p - stage - 1) + (v - 1) * groups.front(), total);
  std::vector<std::vector<Step>> rounds;
  auto backward = [&](int k) {
    const Step& f = table[static_cast<size_t>(k)];
    return Step{Op::kBackward, f.mb, v - 1 - f.chunk};
  };
  for (int k = 0; k < warmup; ++k) rounds.push_back({table[static_cast<size_t>(k)]});
  for (int k = 0; k < total - warmup; ++k)
    rounds.push_back({table[static_cast<size_t>(k + warmup)], backward(k)});
  for (int k = total - warmup; k < total; ++k) rounds.push_back({backward(k)});
  rounds.emplace_back();
  append_flush_step(&rounds.back());
  return rounds;
}

}  // namespace

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kTwoBW:
      return "2bw";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
  }
  return "?";
}

bool parse_schedule_kind(const std::string& name, ScheduleKind* out) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                         ScheduleKind::kTwoBW, ScheduleKind::kZeroBubbleH1}) {
    if (name == to_string(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

bool flushes_every_batch(ScheduleKind k) {
  return k != ScheduleKind::kTwoBW;
}

const char* to_string(Op op) {
  switch (op) {
    case Op::kRecvActivation:
      return "recv-activation";
    case Op::kForward:
      return "forward";
    case Op::kSendActivation:
      return "send-activation";
    case Op::kRecvGrad:
      return "recv-grad";
    case Op::kBackward:
      return "backward";
    case Op::kBackwardInput:
      return "backward-input";
    case Op::kBackwardWeight:
      return "backward-weight";
    case Op::kSendGrad:
      return "send-grad";
    case Op::kReduceGrads:
      return "reduce-grads";
    case Op::kOptimizerStep:
      return "optimizer-step";
    case Op::kSwitchWeights:
      return "switch-weights";
  }
  return "?";
}

std::string schedule_invalid_reason(const ScheduleSpec& s) {
  const std::string name = to_string(s.kind);
  if (s.stages < 1) return "stages must be at least 1, got " + std::to_string(s.stages);
  if (s.microbatches < 1)
    return "microbatches must be at least 1, got " + std::to_string(s.microbatches);
  if (s.chunks < 1) return "chunks must be at least 1, got " + std::to_string(s.chunks);
  if (s.batches < 1) return "batches must be at least 1, got " + std::to_string(s.batches);
  if (s.kind == ScheduleKind::kInterleaved) {
    if (s.chunks < 2)
      return "interleaved needs chunks >= 2 (with 1 chunk it is 1f1b), got " +
             std::to_string(s.chunks);
    if (s.stages < 2) return "interleaved needs stages >= 2, got " + std::to_string(s.stages);
    if (s.microbatches < s.stages)
      return "interleaved needs microbatches >= stages, got microbatches " +
             std::to_string(s.microbatches) + " and stages " + std::to_string(s.stages);
  } else if (s.chunks != 1) {
    return name + " runs one chunk per stage (chunks > 1 is the interleaved schedule), got " +
           std::to_string(s.chunks);
  }
  if (s.batches != 1 && s.kind != ScheduleKind::kTwoBW)
    return name + " flushes after every batch, so a list covers one batch (only 2bw spans " +
           "several), got batches " + std::to_string(s.batches);
  return "";
}

std::vector<Instr> build_schedule(const ScheduleSpec& s, int stage) {
  std::vector<Step> order;
  switch (s.kind) {
    case ScheduleKind::kGPipe:
      order = order_gpipe(s);
      break;
    case ScheduleKind::kOneFOneB:
      order = order_1f1b_flush(s, stage, false);
      break;
    case ScheduleKind::kInterleaved:
      return with_communication(rounds_interleaved(s, stage), stage, s.stages, s.chunks);
    case ScheduleKind::kTwoBW:
      order = order_2bw(s, stage);
      break;
    case ScheduleKind::kZeroBubbleH1:
      order = order_zb_h1(s, stage);
      break;
  }
  return with_communication(one_step_rounds(order), stage, s.stages, s.chunks);
}

std::vector<std::vector<Instr>> build_all(const ScheduleSpec& s) {
  std::vector<std::vector<Instr>> all;
  all.reserve(static_cast<size_t>(s.stages));
  for (int stage = 0; stage < s.stages; ++stage) all.push_back(build_schedule(s, stage));
  return all;
}

std::vector<Instr> build_forward_only(int stage, int p, int v, int m) {
  std::vector<Instr> list;
  for (int mb = 0; mb < m; ++mb)
    for (int c = 0; c < v; ++c) {
      if (prev_piece(stage, c, p, v).stage >= 0) list.push_back({Op::kRecvActivation, mb, c, -1});
      list.push_back({Op::kForward, mb, c, -1});
      if (next_piece(stage, c, p, v).stage >= 0) list.push_back({Op::kSendActivation, mb, c, -1});
    }
  return list;
}

PieceRef next_piece(int stage, int chunk, int p, int v) {
  if (stage < p - 1) return {stage + 1, chunk};
  if (chunk < v - 1) return {0, chunk + 1};
  return {-1, 0};
}

PieceRef prev_piece(int stage, int chunk, int p, int v) {
  if (stage > 0) return {stage - 1, chunk};
  if (chunk > 0) return {p - 1, chunk - 1};
  return {-1, 0};
}

std::string instr_string(const Instr& i) {
  const char* tag = "?";
  switch (i.op) {
    case Op::kRecvActivation:
      tag = "RA";
      break;
    case Op::kForward:
      tag = "F";
      break;
    case Op::kSendActivation:
      tag = "SA";
      break;
    case Op::kRecvGrad:
      tag = "RG";
      break;
    case Op::kBackward:
      tag = "B";
      break;
    case Op::kBackwardInput:
      tag = "B";
      break;
    case Op::kBackwardWeight:
      tag = "W";
      break;
    case Op::kSendGrad:
      tag = "SG";
      break;
    case Op::kReduceGrads:
      return "Reduce";
    case Op::kOptimizerStep:
      return "Step";
    case Op::kSwitchWeights:
      return "Switch";
  }
  return std::string(tag) + std::to_string(i.mb) + "." + std::to_string(i.chunk);
}

}  // namespace strata
