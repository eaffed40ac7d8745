// commands/timeline_svg.h — a picture of one training iteration: a row per pipeline stage (or
// per rank, for a measured run) with its forward, backward, weight-gradient, communication and
// optimizer work on a common time axis, idle time left bare; beside the rows, each stage's
// memory as a stacked bar (parameters, gradients, optimizer state, activations, buffers)
// against the device's memory. The same renderer draws the planner's prediction
// (`strata plan --svg`) and a measured run's log.trace (`strata trace-svg`, or `strata plan
// --svg --measured`), so the two can be laid one above the other on one time scale.
//
// Output: one standalone SVG 1.1 document (no scripts, no external references). Each panel is
// a <g class="panel">, each row a <g class="row" data-label="stage 0"> holding one <rect> per
// piece of work (class forward, backward, weight, comm, optimizer) with a <title> naming it;
// memory bars are <g class="memory">. tests/test_timeline_svg.cc parses it as XML.
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
// (file, "traceEvents", ...) when the trace has no such iteration or is not such a trace.
TimelinePanel trace_panel(const nlohmann::json& trace, int iteration, const std::string& file);

// The SVG document of the panels, stacked, on one time scale (the longest span).
std::string timeline_svg(const std::vector<TimelinePanel>& panels);

// `strata trace-svg`: draws a measured run's log.trace.
int cmd_trace_svg(const std::vector<std::string>& args);

}  // namespace strata
