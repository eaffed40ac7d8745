// test_schedules.cc — the pipeline schedules (schedules/schedule.h), their checker and
// simulator (schedules/simulator.h) and `strata schedule` (launch/commands/schedule.h).
//
// Expected values come from outside the code under test: closed forms of the bubble and of
// the in-flight activations (Megatron-LM and PipeDream papers, derived in docs/schedules.md),
// and the instruction orders of Megatron's schedules written out by hand.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "launch/commands/schedule.h"
#include "runtime/base/error.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                      ScheduleKind::kInterleaved, ScheduleKind::kTwoBW,
                                      ScheduleKind::kZeroBubbleH1};

ScheduleSpec spec_of(ScheduleKind k, int p, int m, int v = 1, int n = 1) {
  ScheduleSpec s;
  s.kind = k;
  s.stages = p;
  s.microbatches = m;
  s.chunks = v;
  s.batches = n;
  return s;
}

std::string describe(const ScheduleSpec& s) {
  return std::string(to_string(s.kind)) + " p=" + std::to_string(s.stages) +
         " m=" + std::to_string(s.microbatches) + " v=" + std::to_string(s.chunks) +
         " n=" + std::to_string(s.batches);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

// Equal op times: forward, backward, backward-input, backward-weight 1 each.
SimOptions unit_times() {
  SimOptions o;
  o.forward = o.backward = o.backward_input = o.backward_weight = 1.0;
  return o;
}

// Calls f for every valid spec of the issue's grid: p 1..8, m 1..16, v 1..4, 2bw batches 1..3.
void for_each_valid_spec(const std::function<void(const ScheduleSpec&)>& f) {
  for (ScheduleKind k : kAllKinds)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m)
        for (int v = 1; v <= 4; ++v)
          for (int n = 1; n <= 3; ++n) {
            const ScheduleSpec s = spec_of(k, p, m, v, n);
            if (schedule_invalid_reason(s).empty()) f(s);
          }
}

// The compute instructions of a list as "F0 F1 B0 ..." (chunk shown when v > 1).
std::string compute_order(const std::vector<Instr>& list, int v) {
  std::string out;
  for (const Instr& i : list) {
    std::string t;
    switch (i.op) {
      case Op::kForward:
        t = "F";
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        t = "B";
        break;
      case Op::kBackwardWeight:
        t = "W";
        break;
      case Op::kReduceGrads:
        t = "R";
        break;
      case Op::kOptimizerStep:
        t = "S";
        break;
      case Op::kSwitchWeights:
        t = "X";
        break;
      default:
        continue;
    }
    if (i.mb >= 0) t += std::to_string(i.mb) + (v > 1 ? "." + std::to_string(i.chunk) : "");
    out += (out.empty() ? "" : " ") + t;
  }
  return out;
}

TEST(ScheduleNames, RoundTrip) {
  for (ScheduleKind k : kAllKinds) {
    ScheduleKind back = ScheduleKind::kGPipe;
    ASSERT_TRUE(parse_schedule_kind(to_string(k), &back));
    EXPECT_EQ(back, k);
  }
  ScheduleKind k = ScheduleKind::kGPipe;
  EXPECT_FALSE(parse_schedule_kind("pipedream", &k));
}

TEST(ScheduleSpecValidity, Rules) {
  EXPECT_EQ(schedule_invalid_reason(spec_of(ScheduleKind::kOneFOneB, 1, 1)), "");
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kOneFOneB, 0, 4)), "");
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kOneFOneB, 4, 0)), "");
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 4, 8, 0)), "");
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kTwoBW, 4, 8, 1, 0)), "");
  // Interleaved: v >= 2, p >= 2, m >= p; any m >= p, not only multiples of p.
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 4, 8, 1)), "");
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 1, 8, 2)), "");
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 4, 3, 2)), "");
  EXPECT_EQ(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 4, 5, 2)), "");
  EXPECT_EQ(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 2, 2, 4)), "");
  // Chunks only for interleaved, batches only for 2bw.
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kTwoBW,
                         ScheduleKind::kZeroBubbleH1})
    EXPECT_NE(schedule_invalid_reason(spec_of(k, 4, 8, 2)), "") << to_string(k);
  for (ScheduleKind k :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1})
    EXPECT_NE(schedule_invalid_reason(spec_of(k, 4, 8, 1, 2)), "") << to_string(k);
  EXPECT_NE(schedule_invalid_reason(spec_of(ScheduleKind::kInterleaved, 4, 8, 2, 2)), "");
  EXPECT_EQ(schedule_invalid_reason(spec_of(ScheduleKind::kTwoBW, 4, 8, 1, 3)), "");
}

TEST(ModelPieces, InterleavedRing) {
  // p = 4, v = 2: pieces 0..7 are (stage, chunk) = (k % 4, k / 4).
  EXPECT_EQ(next_piece(0, 0, 4, 2).stage, 1);
  EXPECT_EQ(next_piece(3, 0, 4, 2).stage, 0);
  EXPECT_EQ(next_piece(3, 0, 4, 2).chunk, 1);
  EXPECT_EQ(next_piece(3, 1, 4, 2).stage, -1);
  EXPECT_EQ(prev_piece(0, 1, 4, 2).stage, 3);
  EXPECT_EQ(prev_piece(0, 1, 4, 2).chunk, 0);
  EXPECT_EQ(prev_piece(0, 0, 4, 2).stage, -1);
  EXPECT_EQ(prev_piece(2, 1, 4, 2).stage, 1);
  EXPECT_EQ(prev_piece(2, 1, 4, 2).chunk, 1);
}

// Evaluation's forward-only lists: every (micro-batch, chunk) forwarded once per stage, in model
// order, each receive matched by the previous piece's send; run with sends that never block
// (the executor's contract) they finish, whatever the stage count, chunks and micro-batches.
TEST(ScheduleOrder, ForwardOnlyListsRunEveryMicroBatchThroughEveryPiece) {
  for (int p = 1; p <= 4; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m = 1; m <= 5; ++m) {
        std::vector<std::vector<Instr>> lists;
        for (int s = 0; s < p; ++s) lists.push_back(build_forward_only(s, p, v, m));
        std::set<std::tuple<int, int, int>> sent;  // (stage, mb, chunk) of a forward's output
        std::vector<size_t> at(static_cast<size_t>(p), 0);
        std::map<std::pair<int, int>, int> forwards;  // [(stage, chunk)] count
        for (bool progress = true; progress;) {
          progress = false;
          for (int s = 0; s < p; ++s) {
            const std::vector<Instr>& l = lists[static_cast<size_t>(s)];
            size_t& i = at[static_cast<size_t>(s)];
            for (; i < l.size(); ++i, progress = true) {
              const Instr& in = l[i];
              if (in.op == Op::kRecvActivation) {
                const PieceRef from = prev_piece(s, in.chunk, p, v);
                if (!sent.count({from.stage, in.mb, from.chunk})) break;  // waits for its send
              } else if (in.op == Op::kSendActivation) {
                sent.insert({s, in.mb, in.chunk});
              } else {
                ASSERT_EQ(in.op, Op::kForward) << instr_string(in);
                ++forwards[{s, in.chunk}];
              }
            }
          }
        }
        for (int s = 0; s < p; ++s) {
          EXPECT_EQ(at[static_cast<size_t>(s)], lists[static_cast<size_t>(s)].size())
              << "stage " << s << " blocked: p " << p << " v " << v << " m " << m;
          for (int c = 0; c < v; ++c) EXPECT_EQ((forwards[{s, c}]), m) << s << "." << c;
        }
      }
}

TEST(ScheduleOrder, OneFOneBIsMegatrons) {
  // Megatron's forward_backward_pipelining_without_interleaving, p = 4, m = 8.
  const auto all = build_all(spec_of(ScheduleKind::kOneFOneB, 4, 8));
  EXPECT_EQ(compute_order(all[0], 1), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 R S");
  EXPECT_EQ(compute_order(all[2], 1), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7 R S");
  EXPECT_EQ(compute_order(all[3], 1), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 R S");
}

TEST(ScheduleOrder, OneFOneBBatchesTransfersLikeMegatron) {
  // Steady state of a middle stage: F(w+i), then {send output, receive gradient} as one group
  // (send_forward_recv_backward), B(i), then {send input gradient, receive next input}
  // (send_backward_recv_forward).
  const std::vector<Instr> l = build_schedule(spec_of(ScheduleKind::kOneFOneB, 4, 8), 1);
  size_t i = 0;
  while (!(l[i].op == Op::kForward && l[i].mb == 2)) ++i;
  ASSERT_LT(i + 6, l.size());
  EXPECT_EQ(l[i + 1].op, Op::kSendActivation);
  EXPECT_EQ(l[i + 1].mb, 2);
  EXPECT_EQ(l[i + 2].op, Op::kRecvGrad);
  EXPECT_EQ(l[i + 2].mb, 0);
  EXPECT_GE(l[i + 1].group, 0);
  EXPECT_EQ(l[i + 1].group, l[i + 2].group);
  EXPECT_EQ(l[i + 3].op, Op::kBackward);
  EXPECT_EQ(l[i + 4].op, Op::kSendGrad);
  EXPECT_EQ(l[i + 5].op, Op::kRecvActivation);
  EXPECT_EQ(l[i + 5].mb, 3);
  EXPECT_GE(l[i + 4].group, 0);
  EXPECT_EQ(l[i + 4].group, l[i + 5].group);
  EXPECT_NE(l[i + 1].group, l[i + 4].group);
}

TEST(ScheduleOrder, GPipeAllForwardsThenBackwardsInOrder) {
  const auto all = build_all(spec_of(ScheduleKind::kGPipe, 3, 4));
  for (const auto& l : all) EXPECT_EQ(compute_order(l, 1), "F0 F1 F2 F3 B0 B1 B2 B3 R S");
}

TEST(ScheduleOrder, InterleavedIsMegatrons) {
  // Megatron's interleaved schedule, p = 2, m = 4, v = 2: groups of p = 2 micro-batches per
  // chunk; warm-up 2(p - stage - 1) + (v - 1)·p forwards; backwards walk the chunks backwards.
  const auto all = build_all(spec_of(ScheduleKind::kInterleaved, 2, 4, 2));
  EXPECT_EQ(compute_order(all[0], 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 R S");
  EXPECT_EQ(compute_order(all[1], 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 R S");
}

TEST(ScheduleOrder, InterleavedUnevenGroups) {
  // m = 5, p = 4: Megatron's default group of p = 4 would leave a group of 1 (< p), so the
  // micro-batches form one group of 5: all five through chunk 0, then through chunk 1.
  const auto all = build_all(spec_of(ScheduleKind::kInterleaved, 4, 5, 2));
  EXPECT_EQ(compute_order(all[3], 2).substr(0, 29), "F0.0 F1.0 F2.0 F3.0 F4.0 F0.1");
}

TEST(ScheduleOrder, ZeroBubbleSplitsBackward) {
  const auto all = build_all(spec_of(ScheduleKind::kZeroBubbleH1, 3, 4));
  EXPECT_EQ(compute_order(all[0], 1), "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3 R S");
  EXPECT_EQ(compute_order(all[2], 1), "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 R S");
  // The input gradient goes upstream right after B, before W.
  const std::vector<Instr>& l = all[1];
  for (size_t i = 0; i + 1 < l.size(); ++i) {
    if (l[i].op == Op::kBackwardInput) {
      EXPECT_EQ(l[i + 1].op, Op::kSendGrad);
    }
  }
}

TEST(ScheduleOrder, TwoBWStepsWithoutFlush) {
  // p = 3, m = 2, 2 batches: the pipeline stays full across the batch boundary; batch 0's
  // reduction starts right after its last backward (R), its step and switch (S X) come as late
  // as they may — before the last backward of batch 1 — while batch 1 runs on W(0); the last
  // batch's at the end.
  const auto all = build_all(spec_of(ScheduleKind::kTwoBW, 3, 2, 1, 2));
  EXPECT_EQ(compute_order(all[0], 1), "F0 F1 F2 B0 F3 B1 R B2 S X B3 R S X");
  EXPECT_EQ(compute_order(all[2], 1), "F0 B0 F1 B1 R F2 B2 F3 S X B3 R S X");
  // p = 2, m = 4, 3 batches, stage 0: batch 0's step before the first forward of batch 2,
  // batch 1's before the last backward of batch 2.
  const auto two = build_all(spec_of(ScheduleKind::kTwoBW, 2, 4, 1, 3));
  EXPECT_EQ(compute_order(two[0], 1),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 R F5 B4 F6 B5 F7 B6 S X F8 B7 R F9 B8 F10 B9 F11 B10 "
            "S X B11 R S X");
}

// 2bw's step collectives (tied embedding, loss and gradient-norm sums) are posted at ReduceGrads
// and completed at the step, which comes as late as the weights allow: with m ≥ 2p no stage ever
// waits for them, and the simulated time with the collectives is the time without. A step taken
// right at ReduceGrads (the blocking implementation before) is a barrier at every batch
// boundary: a flush in all but name.
TEST(Checker, TwoBWStepCollectivesCostNothingWithSlack) {
  SimOptions plain = unit_times();
  plain.backward = 2.0;
  SimOptions coll = plain;
  coll.collectives = true;
  for (int p : {2, 3, 4})
    for (int m : {2 * p, 4 * p}) {
      const ScheduleSpec s = spec_of(ScheduleKind::kTwoBW, p, m, 1, 3);
      const SimResult free = simulate(s, plain), deferred = simulate(s, coll);
      ASSERT_TRUE(deferred.ok()) << describe(s) << "\n" << joined(deferred.problems);
      EXPECT_DOUBLE_EQ(deferred.makespan, free.makespan) << describe(s);
      // The same lists with each step and switch moved up to its ReduceGrads.
      std::vector<std::vector<Instr>> blocking = build_all(s);
      for (std::vector<Instr>& l : blocking) {
        std::vector<Instr> out;
        for (const Instr& in : l) {
          if (in.op == Op::kOptimizerStep || in.op == Op::kSwitchWeights) continue;
          out.push_back(in);
          if (in.op == Op::kReduceGrads) {
            Instr step = in, sw = in;
            step.op = Op::kOptimizerStep;
            sw.op = Op::kSwitchWeights;
            out.push_back(step);
            out.push_back(sw);
          }
        }
        l = out;
      }
      const SimResult barrier = simulate(s, blocking, coll);
      ASSERT_TRUE(barrier.ok()) << describe(s) << "\n" << joined(barrier.problems);
      EXPECT_GT(barrier.makespan, free.makespan + 1.0) << describe(s);
    }
}

TEST(Checker, EverySchedulePassesEveryCheck) {
  // Equal op times and, separately, uneven ones with latency: the lists must finish and
  // satisfy every check whatever the timing.
  SimOptions uneven;
  uneven.forward = 1.0;
  uneven.backward = 2.3;
  uneven.backward_input = 1.1;
  uneven.backward_weight = 0.7;
  uneven.reduce = 0.2;
  uneven.optimizer = 0.5;
  uneven.switch_weights = 0.1;
  uneven.latency = 0.35;
  int checked = 0;
  for_each_valid_spec([&](const ScheduleSpec& s) {
    const auto lists = build_all(s);
    for (const SimOptions& o : {unit_times(), uneven}) {
      const SimResult r = simulate(s, lists, o);
      ASSERT_TRUE(r.ok()) << describe(s) << "\n" << joined(r.problems);
      ASSERT_TRUE(r.finished);
    }
    ++checked;
  });
  // 128 each for gpipe, 1f1b, zb-h1; 3·128 for 2bw; interleaved: v 2..4, p 2..8, m p..16.
  EXPECT_EQ(checked, 3 * 128 + 3 * 128 + 3 * (15 + 14 + 13 + 12 + 11 + 10 + 9));
}

TEST(Checker, RendezvousSends) {
  // The executor's sends never block. Under NCCL-style rendezvous sends (a send completes
  // once its receive is posted) the schedules still run: their groups pair every send with
  // the receive its peer posts at the same point, as Megatron's do (interleaved by receiving
  // one round ahead, as Megatron's send_forward_backward_recv_forward_backward). Interleaved
  // does so with Megatron's groups of p micro-batches (m a multiple of p).
  SimOptions rv = unit_times();
  rv.rendezvous_sends = true;
  rv.latency = 0.1;
  for_each_valid_spec([&](const ScheduleSpec& s) {
    if (s.kind == ScheduleKind::kInterleaved && s.microbatches % s.stages != 0) return;
    const SimResult r = simulate(s, rv);
    ASSERT_TRUE(r.ok()) << describe(s) << "\n" << joined(r.problems);
  });
  // Larger groups (here 4 and 3 for p = 2, m = 7) let the last stage send the wrapped-around
  // activation of micro-batch 0 while stage 0 still forwards chunk 0 to it: each waits for the
  // other's receive. runs_on_rendezvous_sends sees it, and such a run keeps MPI.
  const SimResult uneven = simulate(spec_of(ScheduleKind::kInterleaved, 2, 7, 2), rv);
  EXPECT_FALSE(uneven.finished);
  EXPECT_NE(joined(uneven.problems).find("is blocked sending the activation"), std::string::npos)
      << joined(uneven.problems);
  EXPECT_FALSE(runs_on_rendezvous_sends(spec_of(ScheduleKind::kInterleaved, 2, 7, 2)));
  EXPECT_TRUE(runs_on_rendezvous_sends(spec_of(ScheduleKind::kInterleaved, 2, 5, 2)));
  // Interleaved with just-in-time receives (each receive moved to right before its consumer,
  // each send to right after its producer, as the other schedules have them): two stages each
  // wait on a send to the other, so the receive-ahead is what lets it run on NCCL.
  const ScheduleSpec s = spec_of(ScheduleKind::kInterleaved, 2, 4, 2);
  std::vector<std::vector<Instr>> lists = build_all(s);
  for (std::vector<Instr>& l : lists) {
    std::vector<Instr> jit;
    for (const Instr& in : l) {
      Instr c = in;
      c.group = -1;
      if (c.op == Op::kForward || c.op == Op::kBackward) {
        const bool fwd = c.op == Op::kForward;
        Instr recv = c, send = c;
        recv.op = fwd ? Op::kRecvActivation : Op::kRecvGrad;
        send.op = fwd ? Op::kSendActivation : Op::kSendGrad;
        auto has = [&](const Instr& x) {
          return std::any_of(l.begin(), l.end(), [&](const Instr& y) {
            return y.op == x.op && y.mb == x.mb && y.chunk == x.chunk;
          });
        };
        if (has(recv)) jit.push_back(recv);
        jit.push_back(c);
        if (has(send)) jit.push_back(send);
      } else if (c.op != Op::kRecvActivation && c.op != Op::kRecvGrad &&
                 c.op != Op::kSendActivation && c.op != Op::kSendGrad) {
        jit.push_back(c);
      }
    }
    l = jit;
  }
  EXPECT_TRUE(simulate(s, lists, unit_times()).ok());
  const SimResult r = simulate(s, lists, rv);
  EXPECT_FALSE(r.finished);
  EXPECT_NE(r.problems[0].find("is blocked sending"), std::string::npos) << joined(r.problems);
}

TEST(Checker, CollectivesWithBufferedAndRendezvousSends) {
  // The step is a collective over the pipeline and ReduceGrads one over its two ends (tied
  // embeddings). Every schedule survives that with the executor's buffered sends, and the
  // flushing ones (gpipe, 1f1b, interleaved, zb-h1) with NCCL's rendezvous sends too, which is
  // what lets them run on NCCL.
  for (bool rendezvous : {false, true}) {
    SimOptions o = unit_times();
    o.collectives = true;
    o.rendezvous_sends = rendezvous;
    o.latency = 0.1;
    for_each_valid_spec([&](const ScheduleSpec& s) {
      if (rendezvous) {
        // What the trainer asks before it puts a pipeline on NCCL: yes for every flushing
        // one-chunk schedule and for interleaved with m a multiple of p.
        const bool expected =
            s.kind != ScheduleKind::kTwoBW &&
            (s.kind != ScheduleKind::kInterleaved || s.microbatches % s.stages == 0);
        if (expected) {
          EXPECT_TRUE(runs_on_rendezvous_sends(s)) << describe(s);
        }
        if (!runs_on_rendezvous_sends(s)) return;
      }
      const SimResult r = simulate(s, o);
      ASSERT_TRUE(r.ok()) << describe(s) << (rendezvous ? " (rendezvous)" : "") << "\n"
                          << joined(r.problems);
    });
  }
  // 2bw runs on buffered sends (MPI, staged on GPUs): its step's collectives are completed
  // while the pipeline runs, which rendezvous sends would hold up.
  EXPECT_FALSE(runs_on_rendezvous_sends(spec_of(ScheduleKind::kTwoBW, 2, 2, 1, 2)));
  // A stage left out of the step is named.
  ScheduleSpec s = spec_of(ScheduleKind::kOneFOneB, 3, 3, 1);
  std::vector<std::vector<Instr>> lists = build_all(s);
  lists[2].pop_back();  // stage 2 never steps
  SimOptions o = unit_times();
  o.collectives = true;
  const SimResult r = simulate(s, lists, o);
  EXPECT_FALSE(r.finished);
  EXPECT_NE(joined(r.problems).find("waits in the collective for stage(s) 2"), std::string::npos)
      << joined(r.problems);
}

TEST(Checker, GroupsAreContiguousCommunication) {
  for_each_valid_spec([&](const ScheduleSpec& s) {
    for (const auto& l : build_all(s)) {
      for (size_t i = 0; i < l.size(); ++i) {
        if (l[i].group < 0) continue;
        EXPECT_TRUE(l[i].op == Op::kSendActivation || l[i].op == Op::kRecvActivation ||
                    l[i].op == Op::kSendGrad || l[i].op == Op::kRecvGrad)
            << describe(s);
        // A group is one run: once it ends, its number does not come back.
        if (i > 0 && l[i - 1].group != l[i].group) {
          for (size_t j = 0; j < i; ++j) {
            ASSERT_NE(l[j].group, l[i].group) << describe(s);
          }
        }
      }
    }
  });
}

TEST(Bubble, GPipeAndOneFOneBMatchMegatron) {
  // Megatron's bubble time over ideal time, (p-1)/m, holds for any forward/backward ratio;
  // check F = B and B = 2F.
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        const ScheduleSpec s = spec_of(k, p, m);
        const double expected = static_cast<double>(p - 1) / m;
        SimOptions b2;  // forward 1, backward 2
        for (const SimOptions& o : {unit_times(), b2}) {
          const SimResult r = simulate(s, o);
          EXPECT_NEAR(r.bubble_ratio, expected, 1e-12) << describe(s);
          // As a share of the makespan: (p-1)/(m+p-1).
          EXPECT_NEAR(r.bubble_fraction, (p - 1.0) / (m + p - 1.0), 1e-12) << describe(s);
        }
        EXPECT_NEAR(theoretical_bubble_ratio(s), expected, 1e-12);
        EXPECT_NEAR(theoretical_bubble_fraction(s), (p - 1.0) / (m + p - 1.0), 1e-12);
      }
    }
  }
}

TEST(Bubble, InterleavedMatchesMegatron) {
  // (p-1)/(v·m) for every m >= p, multiples of p or not, with F = B and B = 2F.
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 16; ++m)
      for (int v = 2; v <= 4; ++v) {
        const ScheduleSpec s = spec_of(ScheduleKind::kInterleaved, p, m, v);
        const double expected = static_cast<double>(p - 1) / (v * m);
        for (const SimOptions& o : {unit_times(), SimOptions()})
          EXPECT_NEAR(simulate(s, o).bubble_ratio, expected, 1e-12) << describe(s);
        EXPECT_NEAR(theoretical_bubble_ratio(s), expected, 1e-12);
      }
}

TEST(Bubble, TwoBWPaysTheFillOncePerRun) {
  // No flush between batches: (p-1)/(n·m) over n batches when m >= p-1 (optimizer 0).
  for (int p = 1; p <= 8; ++p)
    for (int m = std::max(1, p - 1); m <= 16; ++m)
      for (int n = 1; n <= 3; ++n) {
        const ScheduleSpec s = spec_of(ScheduleKind::kTwoBW, p, m, 1, n);
        EXPECT_NEAR(simulate(s).bubble_ratio, (p - 1.0) / (n * m), 1e-12) << describe(s);
        EXPECT_NEAR(theoretical_bubble_ratio(s), (p - 1.0) / (n * m), 1e-12);
      }
}

TEST(Bubble, ZeroBubbleBelowOneFOneB) {
  // Equal F, B, W (1f1b's full backward = B + W = 2): 1f1b idles (p-1)(F+B+W) per stage,
  // zb-h1 (p-1)(F+B): bubble ratio 2(p-1)/(3m) against (p-1)/m, for m < p as well.
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      SimOptions o;  // forward 1, backward 2, backward_input 1, backward_weight 1
      const SimResult zb = simulate(spec_of(ScheduleKind::kZeroBubbleH1, p, m), o);
      const SimResult f1b = simulate(spec_of(ScheduleKind::kOneFOneB, p, m), o);
      EXPECT_LT(zb.makespan, f1b.makespan) << p << " " << m;
      EXPECT_LT(zb.bubble_ratio, f1b.bubble_ratio) << p << " " << m;
      EXPECT_NEAR(zb.bubble_ratio, 2.0 * (p - 1) / (3.0 * m), 1e-12) << p << " " << m;
      EXPECT_NEAR(zb.makespan, 3.0 * m + 2.0 * (p - 1), 1e-12);
      EXPECT_NEAR(theoretical_bubble_ratio(spec_of(ScheduleKind::kZeroBubbleH1, p, m)),
                  2.0 * (p - 1) / (3.0 * m), 1e-12);
      EXPECT_NEAR(f1b.makespan, 3.0 * m + 3.0 * (p - 1), 1e-12);
    }
}

TEST(Bubble, LatencyAddsTwoHopsPerStage) {
  // GPipe with point-to-point latency L: the first forward crosses p-1 links and the last
  // backward crosses them back, so makespan = (m+p-1)(F+B) + 2(p-1)L.
  SimOptions o;
  o.forward = 1.0;
  o.backward = 2.0;
  o.latency = 0.25;
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 8; ++m)
      EXPECT_NEAR(simulate(spec_of(ScheduleKind::kGPipe, p, m), o).makespan,
                  (m + p - 1) * 3.0 + 2 * (p - 1) * 0.25, 1e-12);
}

TEST(Bubble, PerStageDurations) {
  // A stage twice as slow sets the pace: 1f1b, p = 2, stage 1 at 2 per op, m = 4.
  // Stage 1 runs F0 B0 F1 B1 ... back to back (16) after waiting for F0 (1): makespan 17
  // plus stage 0's last backward (1) after stage 1's.
  SimOptions o;
  o.duration = [](int stage, const Instr& i) {
    if (i.op == Op::kReduceGrads || i.op == Op::kOptimizerStep) return 0.0;
    return stage == 1 ? 2.0 : 1.0;
  };
  const SimResult r = simulate(spec_of(ScheduleKind::kOneFOneB, 2, 4), o);
  ASSERT_TRUE(r.ok()) << joined(r.problems);
  EXPECT_NEAR(r.makespan, 18.0, 1e-12);
  EXPECT_NEAR(r.busy[0], 8.0, 1e-12);
  EXPECT_NEAR(r.busy[1], 16.0, 1e-12);
}

TEST(InFlight, OneFOneBHoldsPMinusStage) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const SimResult r = simulate(spec_of(ScheduleKind::kOneFOneB, p, m));
      for (int s = 0; s < p; ++s) EXPECT_EQ(r.peak_inflight[s], std::min(p - s, m)) << p << m;
    }
}

TEST(InFlight, GPipeHoldsAllMicrobatches) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const SimResult r = simulate(spec_of(ScheduleKind::kGPipe, p, m));
      for (int s = 0; s < p; ++s) EXPECT_EQ(r.peak_inflight[s], m);
    }
}

TEST(InFlight, ZeroBubbleEqualsOneFOneBOnEachStage) {
  // Counted from F to W, where zb-h1 frees a micro-batch's activations.
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const SimResult zb = simulate(spec_of(ScheduleKind::kZeroBubbleH1, p, m));
      const SimResult f1b = simulate(spec_of(ScheduleKind::kOneFOneB, p, m));
      EXPECT_EQ(zb.peak_inflight, f1b.peak_inflight) << p << " " << m;
    }
}

TEST(InFlight, InterleavedAsMegatron) {
  // Megatron holds warm-up + 1 (mb, chunk) pairs: 2(p-s-1) + (v-1)·p + 1 when p divides m,
  // at most m·v.
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 16; m += p)
      for (int v = 2; v <= 4; ++v) {
        const SimResult r = simulate(spec_of(ScheduleKind::kInterleaved, p, m, v));
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(r.peak_inflight[s], std::min(2 * (p - s - 1) + (v - 1) * p + 1, m * v))
              << p << " " << m << " " << v << " stage " << s;
      }
  // p = 4, m = 9 forms groups of 5 and 4 (no group below p): stage 0 holds 2·3 + 5 + 1.
  const SimResult r = simulate(spec_of(ScheduleKind::kInterleaved, 4, 9, 2));
  EXPECT_EQ(r.peak_inflight, (std::vector<int>{12, 10, 8, 6}));
}

TEST(InFlight, TwoBWAtMostPMinusStageAndTwoVersions) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m)
      for (int n = 1; n <= 3; ++n) {
        const SimResult r = simulate(spec_of(ScheduleKind::kTwoBW, p, m, 1, n));
        for (int s = 0; s < p; ++s) {
          EXPECT_LE(r.peak_inflight[s], p - s);
          // Two versions as soon as a batch runs while a newer version exists.
          EXPECT_EQ(r.peak_weight_versions[s], n >= 2 ? 2 : 1) << p << m << n << " " << s;
        }
      }
  // Flushing schedules need one version.
  for (int v : simulate(spec_of(ScheduleKind::kOneFOneB, 4, 8)).peak_weight_versions)
    EXPECT_EQ(v, 1);
}

TEST(BrokenLists, MissingSendIsADeadlockNamingTheStage) {
  const ScheduleSpec s = spec_of(ScheduleKind::kOneFOneB, 4, 8);
  auto lists = build_all(s);
  // Stage 1 forgets to send the output of F5 to stage 2.
  auto& l = lists[1];
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i].op == Op::kSendActivation && l[i].mb == 5) {
      l.erase(l.begin() + static_cast<long>(i));
      break;
    }
  const SimResult r = simulate(s, lists, unit_times());
  EXPECT_FALSE(r.finished);
  EXPECT_FALSE(r.ok());
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].find("deadlock: stage 2"), std::string::npos) << joined(r.problems);
  EXPECT_NE(r.problems[0].find("RA5.0"), std::string::npos) << r.problems[0];
  EXPECT_NE(r.problems[0].find("stage 1 never sends"), std::string::npos) << r.problems[0];
  EXPECT_GE(r.blocked_at[2], 0);
  // The static checks name the missing send too.
  const std::string all = joined(r.problems);
  EXPECT_NE(all.find("the forward's output is never sent"), std::string::npos) << all;
  EXPECT_NE(all.find("sent 0 time(s) and received 1"), std::string::npos) << all;
}

TEST(BrokenLists, ReceiveTooEarlyDeadlocks) {
  // Stage 0 waits for micro-batch 0's gradient right after sending F0's output: stage 1 needs
  // F1 and F2 before its first backward, so neither can move.
  const ScheduleSpec s = spec_of(ScheduleKind::kOneFOneB, 4, 8);
  auto lists = build_all(s);
  auto& l = lists[0];
  Instr rg;
  size_t from = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i].op == Op::kRecvGrad && l[i].mb == 0) from = i;
  rg = l[from];
  rg.group = -1;
  l[from - 1].group = -1;  // its group partner stays alone
  l.erase(l.begin() + static_cast<long>(from));
  ASSERT_EQ(l[1].op, Op::kSendActivation);
  l.insert(l.begin() + 2, rg);  // right after F0 and its send
  const SimResult r = simulate(s, lists, unit_times());
  EXPECT_FALSE(r.finished);
  EXPECT_NE(r.problems[0].find("deadlock: stage 0"), std::string::npos) << joined(r.problems);
  EXPECT_NE(r.problems[0].find("RG0.0"), std::string::npos) << r.problems[0];
  EXPECT_NE(r.problems[0].find("stage 1 has not sent yet (it waits at instruction 3, RA1.0)"),
            std::string::npos)
      << r.problems[0];
  EXPECT_NE(r.problems[1].find("deadlock: stage 1"), std::string::npos) << joined(r.problems);
  EXPECT_NE(r.problems[1].find("RA1.0"), std::string::npos) << r.problems[1];
}

TEST(BrokenLists, BackwardBeforeForwardAndMissingStep) {
  const ScheduleSpec s = spec_of(ScheduleKind::kGPipe, 1, 3);
  auto lists = build_all(s);
  auto& l = lists[0];  // F0 F1 F2 B0 B1 B2 Reduce Step
  std::swap(l[0], l[3]);
  l.pop_back();
  const SimResult r = simulate(s, lists, unit_times());
  EXPECT_TRUE(r.finished);
  const std::string all = joined(r.problems);
  EXPECT_NE(all.find("micro-batch 0 chunk 0 is backwarded before forward"), std::string::npos)
      << all;
  EXPECT_NE(all.find("1 ReduceGrads and 0 OptimizerStep"), std::string::npos) << all;
}

TEST(BrokenLists, TwoBWForwardBeforeItsWeights) {
  // Batch 2 needs W(1), produced by batch 0's step: move the first forward of batch 2 on the
  // last stage ahead of that step.
  const ScheduleSpec s = spec_of(ScheduleKind::kTwoBW, 2, 2, 1, 3);
  auto lists = build_all(s);
  auto& l = lists[1];
  size_t f4 = 0, ra4 = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i].op == Op::kForward && l[i].mb == 4) f4 = i;
    if (l[i].op == Op::kRecvActivation && l[i].mb == 4) ra4 = i;
  }
  ASSERT_EQ(ra4 + 1, f4);
  std::vector<Instr> moved(l.begin() + static_cast<long>(ra4),
                           l.begin() + static_cast<long>(f4) + 1);
  for (Instr& i : moved) i.group = -1;
  l.erase(l.begin() + static_cast<long>(ra4), l.begin() + static_cast<long>(f4) + 1);
  l.insert(l.begin(), moved.begin(), moved.end());
  const SimResult r = simulate(s, lists, unit_times());
  const std::string all = joined(r.problems);
  EXPECT_NE(all.find("before the weight switch of batch 0"), std::string::npos) << all;
}

TEST(Timeline, ChromeTrace) {
  const SimResult r = simulate(spec_of(ScheduleKind::kInterleaved, 2, 4, 2), unit_times());
  const nlohmann::json doc = nlohmann::json::parse(chrome_trace_json(r, 1000.0));
  int x = 0;
  bool saw_f31 = false;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++x;
    EXPECT_EQ(e.at("pid"), 0);
    EXPECT_GE(e.at("tid").get<int>(), 0);
    EXPECT_LT(e.at("tid").get<int>(), 2);
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    if (e.at("name") == "F3.1") {
      saw_f31 = true;
      EXPECT_NEAR(e.at("dur").get<double>(), 1000.0, 1e-9);
    }
  }
  EXPECT_EQ(x, static_cast<int>(r.timeline.size()));
  EXPECT_TRUE(saw_f31);
  // 2 stages × (8 forwards + 8 backwards + reduce + step).
  EXPECT_EQ(r.timeline.size(), 2u * 18u);
}

TEST(Timeline, TextDiagram) {
  const SimResult r = simulate(spec_of(ScheduleKind::kOneFOneB, 2, 3), unit_times());
  EXPECT_EQ(text_diagram(r, 2, 1),
            "stage 0 | F0 F1 .  B0 F2 B1 .  B2\n"
            "stage 1 | .  F0 B0 F1 B1 F2 B2 .\n");
}

// Runs cmd_schedule, returning its status and stdout.
int run_cmd(const std::vector<std::string>& args, std::string* out) {
  testing::internal::CaptureStdout();
  int status = -1;
  try {
    status = cmd_schedule(args);
  } catch (...) {
    *out = testing::internal::GetCapturedStdout();
    throw;
  }
  *out = testing::internal::GetCapturedStdout();
  return status;
}

TEST(Command, PrintsDiagramAndBubble) {
  std::string out;
  ASSERT_EQ(run_cmd({"--schedule", "1f1b", "--stages", "4", "--microbatches", "8"}, &out), 0);
  EXPECT_NE(out.find("stage 0 | F0 F1 F2 F3 .  .  .  B0 F4 B1"), std::string::npos) << out;
  EXPECT_NE(out.find("stage 3 | .  .  .  F0 B0 F1 B1"), std::string::npos) << out;
  EXPECT_NE(out.find("simulated 0.3750, theory (p-1)/m = 0.3750"), std::string::npos) << out;
  EXPECT_NE(out.find("): 4 3 2 1"), std::string::npos) << out;
  ASSERT_EQ(
      run_cmd({"--schedule=interleaved", "--stages=2", "--microbatches=4", "--chunks=2"}, &out), 0);
  EXPECT_NE(out.find("theory (p-1)/(v*m) = 0.1250"), std::string::npos) << out;
  EXPECT_NE(out.find("F0.0 F1.0 F0.1"), std::string::npos) << out;
}

TEST(Command, WritesTraceAndList) {
  const std::string path = testing::TempDir() + "strata_schedule_trace.json";
  std::string out;
  ASSERT_EQ(run_cmd({"--schedule", "2bw", "--stages", "2", "--microbatches", "2", "--batches", "2",
                     "--trace", path, "--list"},
                    &out),
            0);
  EXPECT_NE(out.find("Reduce Step Switch"), std::string::npos) << out;
  EXPECT_NE(out.find("peak weight versions per stage: 2 2"), std::string::npos) << out;
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_GT(doc.at("traceEvents").size(), 8u);
  std::remove(path.c_str());
}

TEST(Command, Help) {
  std::string out;
  EXPECT_EQ(run_cmd({"--help"}, &out), 0);
  EXPECT_NE(out.find("usage: strata schedule"), std::string::npos);
}

// The flag and expectation an InputError names.
std::pair<std::string, std::string> input_error(const std::vector<std::string>& args) {
  std::string out;
  try {
    run_cmd(args, &out);
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "<command line>");
    return {e.where(), e.expected()};
  }
  ADD_FAILURE() << "no InputError";
  return {};
}

TEST(Command, BadArguments) {
  EXPECT_EQ(input_error({"--schedule", "1f1b", "--stages", "x", "--microbatches", "4"}),
            std::make_pair(std::string("--stages"), std::string("a positive integer, got x")));
  EXPECT_EQ(input_error({"--schedule", "1f1b", "--stages", "4", "--microbatches", "0"}).first,
            "--microbatches");
  EXPECT_EQ(input_error({"--schedule", "1f1b", "--stages", "-2", "--microbatches", "4"}).first,
            "--stages");
  EXPECT_EQ(input_error({"--schedule", "1f1b", "--stages", "4"}).first, "--microbatches");
  EXPECT_EQ(input_error({"--schedule", "pipedream", "--stages", "4", "--microbatches", "4"}).first,
            "--schedule");
  EXPECT_EQ(
      input_error({"--schedule", "1f1b", "--stages", "4", "--microbatches", "4", "--bogus"}).first,
      "--bogus");
  EXPECT_EQ(input_error({"--schedule", "1f1b", "--stages"}).first, "--stages");
  // A spec the schedule cannot run names the schedule and the reason.
  const auto e = input_error(
      {"--schedule", "interleaved", "--stages", "4", "--microbatches", "3", "--chunks", "2"});
  EXPECT_EQ(e.first, "--schedule");
  EXPECT_NE(e.second.find("microbatches >= stages"), std::string::npos) << e.second;
}

}  // namespace
}  // namespace strata
