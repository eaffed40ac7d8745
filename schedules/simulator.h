// simulator.h — the schedule checker and simulator.
//
// simulate() runs all stages' instruction lists (schedule.h) together on a model of the
// machine: each stage executes its list in order; a compute instruction takes its duration
// (SimOptions; with `collectives`, ReduceGrads and OptimizerStep also wait for the stages they
// reduce with); a send never blocks and is stamped with the stage's current time; a receive
// completes at max(now, time of the matching send + latency) and blocks the stage until that
// send has happened; a group (instructions sharing `group`) is posted as one batch: all its
// sends at the time the stage reaches the group, then the stage waits for all its receives.
// This is the executor's contract, so a list that finishes here cannot deadlock there
// whatever the relative speed of the stages: the times computed are a pure data-flow result.
//
// Alongside, it checks what the executor relies on (SimResult::problems):
//   - every stage finishes; otherwise a deadlock names each blocked stage, the transfer it is
//     blocked on and the stage on the other end, causes (a transfer whose other end is in no
//     list) first;
//   - every receive has exactly one matching send and every send exactly one receive;
//   - on each stage: every (mb, chunk) of every batch is forwarded once and backwarded once
//     (a full backward, or one backward-input and one backward-weight pass), every backward
//     follows its forward, every weight pass its input pass; a forward's input is received
//     before it and its output sent after it, likewise for gradients; groups are contiguous
//     runs of communication;
//   - each batch has one ReduceGrads and then one OptimizerStep, after every backward (and
//     weight pass) of that batch on the stage;
//   - 2bw: one SwitchWeights per batch, after that batch's step; every op of batch b >= 2
//     after the switch of batch b-2 (so it finds W(b-1)), and at most two weight versions
//     needed at any point (peak_weight_versions). Other schedules have no SwitchWeights.
//
// Thread-safety: pure functions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "schedules/schedule.h"

namespace strata {

// Durations in any time unit (seconds for the planner; 1 per op for diagrams). Per-op values
// apply to every stage and chunk unless `duration` is set.
struct SimOptions {
  double forward = 1.0;          // forward(mb, chunk)
  double backward = 2.0;         // full backward: input and weight gradients
  double backward_input = 1.0;   // zero-bubble B
  double backward_weight = 1.0;  // zero-bubble W
  double reduce = 0.0;           // kReduceGrads
  double optimizer = 0.0;        // kOptimizerStep
  double switch_weights = 0.0;   // kSwitchWeights
  double latency = 0.0;          // point-to-point: a receive completes at >= send time + latency
  // The stricter transport of NCCL's grouped send/recv: a send (and its group) completes only
  // once the receiving stage has posted the matching receive. The executor's contract is
  // non-blocking sends (false); true checks that the lists also survive rendezvous sends.
  bool rendezvous_sends = false;
  // A transfer moves only once its receive is posted too (MPI's rendezvous for large messages,
  // NCCL's send/receive kernels): a receive completes at max(send time, the time the receive
  // was posted) + latency. False: at send time + latency, whenever the receive is posted.
  bool transfer_at_receive = false;
  // ReduceGrads and OptimizerStep as the collectives the trainer makes them: batch b's
  // ReduceGrads on the first and the last stage waits for the other's (the tied embedding's
  // gradient sum), and its OptimizerStep on every stage for all the others' (the loss and
  // gradient-norm sums over the pipeline). 2bw's are non-blocking: every stage's ReduceGrads
  // of batch b posts them and goes on, its OptimizerStep waits until every stage has posted.
  // Off: they only take their time.
  bool collectives = false;
  // When set, the duration of every non-communication instruction on `stage` (per stage and
  // chunk costs, e.g. an uneven layer split or the head on the last stage); the fields above
  // are then unused except `latency` and `rendezvous_sends`.
  std::function<double(int stage, const Instr& instr)> duration;
};

// One executed compute instruction (communication is not drawn: it takes no stage time).
struct TimelineEvent {
  int stage = 0;
  Op op = Op::kForward;
  int mb = -1;
  int chunk = 0;
  double start = 0.0;
  double end = 0.0;
};

struct SimResult {
  // Every stage ran its whole list.
  bool finished = false;
  // [stage] index of the receive the stage is blocked on (in a group, the first one whose send
  // has not happened), -1 when it finished.
  std::vector<int> blocked_at;
  // The deadlock (first, when there is one) and every failed check, one sentence each;
  // empty when the lists are a valid schedule.
  std::vector<std::string> problems;
  bool ok() const { return finished && problems.empty(); }

  // End of the last instruction on any stage (the batch's, or 2bw's whole run's, time).
  double makespan = 0.0;
  // [stage] time spent in compute instructions (forward, backward, W, reduce, step, switch).
  std::vector<double> busy;
  // Bubble, two ways (both 0 for a pipeline without idle time):
  //   bubble_fraction = 1 - Σ busy / (p · makespan): the share of the stages' time spent
  //     idle (the executor's measured "compute-idle time / step time");
  //   bubble_ratio = (p · makespan - Σ busy) / Σ busy: idle time relative to the ideal
  //     (compute-only) time, Megatron's measure: (p-1)/m for gpipe and 1f1b, (p-1)/(v·m) for
  //     interleaved, whatever the forward/backward time ratio (optimizer and reduce taking 0).
  // They convert as fraction = ratio / (1 + ratio).
  double bubble_fraction = 0.0;
  double bubble_ratio = 0.0;
  // [stage] most (mb, chunk) pairs whose activations are held at once: a pair counts from its
  // forward to the end of its backward (the weight pass W for zero-bubble schedules). With v
  // chunks a pair holds 1/v of the stage's layers.
  std::vector<int> peak_inflight;
  // [stage] most weight versions needed at once: the versions of batches started and not
  // finished on the stage, plus the newest version. 1 for flushing schedules, <= 2 for 2bw.
  std::vector<int> peak_weight_versions;
  // Executed compute instructions, by start time then stage.
  std::vector<TimelineEvent> timeline;
};

// Checks and simulates `lists` ([stage] instructions) as the schedule `spec` describes.
SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Instr>>& lists,
                   const SimOptions& opt = SimOptions());

// build_all(spec), then simulate. Precondition: schedule_invalid_reason(spec) is "".
SimResult simulate(const ScheduleSpec& spec, const SimOptions& opt = SimOptions());

// Whether `spec`'s lists also run where a send holds up its stage until the matching receive is
// posted (NCCL's point-to-point): proven by simulating them so, with the step's collectives.
// gpipe, 1f1b and zb-h1 always do (their groups pair each send with the receive the peer posts
// at the same point; tests/test_schedules.cc checks every spec); interleaved does with
// Megatron's micro-batch groups of p (m a multiple of p) and with some other m; 2bw never (its
// step, a collective over the pipeline, falls between a grouped send and its receive), and is
// answered without simulating its run-long list. Where false, a run on GPUs keeps the
// pipeline's transfers on MPI's buffered sends (RunLayout::transport in launch/train/run_layout.cc,
// docs/schedules.md).
bool runs_on_rendezvous_sends(const ScheduleSpec& spec);

// Megatron's closed form for the bubble ratio of `spec` with equal op times (idle over ideal
// compute time): (p-1)/m for gpipe and 1f1b, (p-1)/(v·m) interleaved, (p-1)/(n·m) for 2bw's
// n batches when m >= p-1, and 2(p-1)/(3m) for zb-h1 with F = B = W (docs/schedules.md).
double theoretical_bubble_ratio(const ScheduleSpec& spec);

// The same as a share of the makespan: ratio / (1 + ratio), e.g. (p-1)/(v·m + p-1).
double theoretical_bubble_fraction(const ScheduleSpec& spec);

// The timeline as a Chrome trace (chrome://tracing, Perfetto): {"traceEvents": [...]} with one
// "X" event per compute instruction, pid 0, tid = stage, name instr_string() ("F3.1"), ts and
// dur in microseconds = time · us_per_unit (1e6 when durations are in seconds).
std::string chrome_trace_json(const SimResult& r, double us_per_unit = 1e6);

// The timeline as text, one row per stage, one column per time unit: each op's label in the
// column of its start time ("F3", "B3", "W3"; "F3.1" with chunks), '.' for idle, columns
// padded to the widest label. Meant for timelines simulated with unit op times; times are
// rounded to whole units. Reduce/step/switch instructions taking no time are not drawn.
std::string text_diagram(const SimResult& r, int stages, int chunks);

}  // namespace strata
