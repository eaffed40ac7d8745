// commands/timeline_svg.h — a picture of one training iteration: a row per pipeline stage (or
// per rank, for a measured run) with its forward, backward, weight-gradient, communication and
// optimizer work on a common time axis (ticks at round times: 1, 2 or 5 × 10^k), idle time left
// bare; beside the rows, each stage's memory as a stacked bar (parameters, gradients, optimizer
// state, activations, buffers) on a GiB scale of its own, against the device's memory. The same
// renderer draws the planner's prediction
// (`strata plan --svg`) and a measured run's log.trace (`strata trace-svg`, or `strata plan
// --svg --measured`), so the two can be laid one above the other on one time scale.
//
// Output: one standalone SVG 1.1 document (no scripts, no external references). The legend is
// <g class="legend"> with a <g class="legend-work"> (the kinds of work drawn, and idle) and, when
// memory is drawn, a <g class="legend-memory"> (the memory categories present, in colours of
// their own), each entry a <g class="legend-item" data-kind="...">. Each panel is a
// <g class="panel">, each row a <g class="row" data-label="stage 0"> (a measured rank's row also
// carries data-tp, data-pp, data-dp, data-cp and names them in its label) holding one <rect> per
// piece of work (class forward, backward, weight, comm, optimizer) with a <title> naming it; the
// time axis is <g class="axis">, memory bars are <g class="memory">, their scale
// <g class="memory-axis">; each tick label is a <text class="tick">. With no memory drawn the
// picture ends at the time axis's right end (no empty memory column).
// tests/test_timeline_svg.cc parses it as XML.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "partitioner/planner.h"

namespace strata {

enum class WorkKind { kForward, kBackward, kWeight, kComm, kOptimizer };
const char* to_string(WorkKind k);

struct WorkBar {
  double start_s = 0, end_s = 0;
  WorkKind kind = WorkKind::kForward;
  std::string label;  // "F3.1" (micro-batch 3, chunk 1)
};

struct TimelineRow {
  std::string label;
  std::vector<WorkBar> bars;
  // A measured rank's place in the layout (the trace's thread_name metadata); -1: unknown.
  int tp = -1, pp = -1, dp = -1, cp = -1;
};

struct MemoryBar {
  std::string label;
  std::vector<std::pair<std::string, double>> parts;  // (category, bytes), stacked in order
};

struct TimelinePanel {
  std::string title;
  std::vector<TimelineRow> rows;
  double span_s = 0;              // the iteration's length (the time axis runs 0 … span_s)
  std::vector<MemoryBar> memory;  // [stage]; empty for a measured run
  double memory_limit_bytes = 0;  // the device's memory (0: no line)
  // A measured run's description, as its log.trace records it (the "process_name" metadata
  // event's args: layout, device, backend, parameters, world_size); null when the trace has none
  // (written before strata train recorded it).
  nlohmann::json run;
};

// The chosen plan's predicted iteration, from its simulated timeline (iteration_time with
// keep_timeline): forward and backward bars split into their compute and communication shares
// (exposed tensor-parallel collectives, transfers both ends wait for), the exposed data-parallel
// reduction (ReduceGrads) as communication, the step as optimizer work; memory per stage.
TimelinePanel plan_panel(const PlanResult& plan, const IterationTime& timed, const Cluster& cl,
                         const std::string& title);

// Iteration `iteration` (1-based; 0: the last complete one) of a Chrome trace written by
// `strata train` (log.trace: one track per world rank, an event per schedule instruction,
// "cat" the instruction's kind): a row per rank, receive waits as communication. InputError
// (file, "traceEvents", ...) when the trace has no such iteration or is not such a trace. The
// trace's metadata events (strata train writes them first) give each row its tensor, pipeline,
// data (and context) coordinates and the panel its `run`.
TimelinePanel trace_panel(const nlohmann::json& trace, int iteration, const std::string& file);

// The SVG document of the panels, stacked, on one time scale (the longest span).
std::string timeline_svg(const std::vector<TimelinePanel>& panels);

// Ticks for an axis from 0 to `span` (> 0): the step a round number (1, 2 or 5 × 10^k) giving at
// most `most` intervals, the ticks 0, step, 2·step, ... up to span.
std::vector<double> round_ticks(double span, int most);

// `strata trace-svg`: draws a measured run's log.trace.
int cmd_trace_svg(const std::vector<std::string>& args);

}  // namespace strata
