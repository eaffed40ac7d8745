#include "launch/commands/schedule.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "launch/args.h"
#include "runtime/base/error.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

const char* kScheduleUsage =
    "usage: strata schedule --schedule S --stages p --microbatches m [--chunks v]\n"
    "                       [--batches n] [--trace OUT.json] [--list]\n"
    "\n"
    "Prints a pipeline schedule: one row per stage, its forwards (F), backwards (B) and\n"
    "zero-bubble weight passes (W) on a time axis simulated with equal op times, '.' for idle;\n"
    "then the simulated bubble beside the schedule's closed form and the peak in-flight\n"
    "activations per stage. See docs/schedules.md.\n"
    "\n"
    "options:\n"
    "  --schedule S       gpipe, 1f1b, interleaved, 2bw or zb-h1\n"
    "  --stages p         pipeline stages\n"
    "  --microbatches m   micro-batches per batch (interleaved: at least p)\n"
    "  --chunks v         model chunks per stage, interleaved only (at least 2; default 1)\n"
    "  --batches n        batches the list spans, 2bw only (default 1)\n"
    "  --trace OUT.json   write the simulated timeline as a Chrome trace (one op = 1 ms)\n"
    "  --list             also print each stage's instruction list with its transfers\n"
    "  --help             this text\n"
    "\n"
    "exit status: 0 done, 2 bad input (one line: error: <command line>: <flag>: <expected>)\n";

// The lists hold a forward and a backward (zb-h1: and a weight pass) with their transfers per
// micro-batch, chunk, batch and stage, and the diagram has a row per stage and a column per op of
// the longest stage, at least two per stage of fill and drain: stages × (chunks × microbatches
// × batches + stages) measures both. 2^19 builds, simulates and draws in under two seconds and
// 300 MB; far beyond it the command runs out of memory, and long before that it stops showing
// anything a reader can use.
constexpr double kMaxScheduleUnits = 1 << 19;

// Refuses sizes whose lists and diagram cannot be built, naming the largest of the sizes.
void check_schedule_size(const ScheduleSpec& s) {
  const double per_stage = double{1} * s.chunks * s.microbatches * s.batches;
  const double units = s.stages * (per_stage + s.stages);
  if (units <= kMaxScheduleUnits) return;
  const std::pair<const char*, int> sizes[] = {{"--stages", s.stages},
                                               {"--microbatches", s.microbatches},
                                               {"--chunks", s.chunks},
                                               {"--batches", s.batches}};
  const auto* largest = &sizes[0];
  for (const auto& size : sizes)
    if (size.second > largest->second) largest = &size;
  using std::to_string;
  bad_flag(largest->first, "stages × (chunks × microbatches × batches + stages) at most " +
                               to_string(static_cast<int64_t>(kMaxScheduleUnits)) +
                               " (the lists and the diagram grow with it), got " +
                               to_string(s.stages) + " × (" + to_string(s.chunks) + " × " +
                               to_string(s.microbatches) + " × " + to_string(s.batches) + " + " +
                               to_string(s.stages) + ")");
}

std::string theory_formula(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      return "(p-1)/m";
    case ScheduleKind::kInterleaved:
      return "(p-1)/(v*m)";
    case ScheduleKind::kTwoBW:
      return "(p-1)/(n*m)";
    case ScheduleKind::kZeroBubbleH1:
      return "2(p-1)/(3m)";
  }
  return "?";
}

}  // namespace

int cmd_schedule(const std::vector<std::string>& args) {
  std::string schedule, trace_path;
  int stages = 0, microbatches = 0, chunks = 1, batches = 1;
  bool list = false;  // stages and microbatches stay 0 until given
  const std::vector<Flag> flags = {
      text_flag("--schedule", &schedule),
      positive_flag("--stages", &stages),
      positive_flag("--microbatches", &microbatches),
      positive_flag("--chunks", &chunks),
      positive_flag("--batches", &batches),
      path_flag("--trace", &trace_path, "a file name"),
      switch_flag("--list", &list),
  };
  if (!read_flags(args, flags, kScheduleUsage,
                  "an option of strata schedule (--schedule, --stages, --microbatches, --chunks, "
                  "--batches, --trace, --list, --help)"))
    return 0;

  ScheduleSpec spec;
  if (schedule.empty())
    bad_flag("--schedule", "a schedule: gpipe, 1f1b, interleaved, 2bw or zb-h1");
  if (!parse_schedule_kind(schedule, &spec.kind))
    bad_flag("--schedule", "gpipe, 1f1b, interleaved, 2bw or zb-h1, got " + schedule);
  if (stages == 0) bad_flag("--stages", "the number of pipeline stages");
  if (microbatches == 0) bad_flag("--microbatches", "the number of micro-batches per batch");
  spec.stages = stages;
  spec.microbatches = microbatches;
  spec.chunks = chunks;
  spec.batches = batches;
  if (const std::string why = schedule_invalid_reason(spec); !why.empty())
    bad_flag("--schedule", why);
  check_schedule_size(spec);
  if (!trace_path.empty()) check_output_flag("--trace", trace_path);

  // Equal op times: one column per forward, backward and weight pass; reduce and step take no
  // time, so the diagram shows only the pipeline.
  SimOptions unit;
  unit.forward = unit.backward = unit.backward_input = unit.backward_weight = 1.0;
  const std::vector<std::vector<Instr>> lists = build_all(spec);
  const SimResult r = simulate(spec, lists, unit);
  if (!r.ok()) {
    // A schedule that fails its own checks is a bug here, not bad input.
    for (const std::string& why : r.problems) std::fprintf(stderr, "error: %s\n", why.c_str());
    return 1;
  }

  std::cout << "schedule " << to_string(spec.kind) << ": p = " << stages
            << " stages, m = " << microbatches << " micro-batches";
  if (spec.kind == ScheduleKind::kInterleaved) std::cout << ", v = " << chunks << " chunks";
  if (spec.kind == ScheduleKind::kTwoBW) std::cout << ", n = " << batches << " batches";
  std::cout << " (equal op times, one column each)\n\n" << text_diagram(r, stages, chunks) << "\n";

  char line[160];
  std::snprintf(line, sizeof line,
                "bubble, idle over ideal time: simulated %.4f, theory %s = %.4f\n", r.bubble_ratio,
                theory_formula(spec.kind).c_str(), theoretical_bubble_ratio(spec));
  std::cout << line;
  std::snprintf(line, sizeof line, "bubble, share of the makespan: %.4f\n", r.bubble_fraction);
  std::cout << line;
  std::cout << "peak in-flight activations per stage (micro-batch, chunk pairs";
  if (chunks > 1) std::cout << ", each 1/" << chunks << " of the stage's layers";
  std::cout << "):";
  for (int n : r.peak_inflight) std::cout << ' ' << n;
  std::cout << '\n';
  if (spec.kind == ScheduleKind::kTwoBW) {
    std::cout << "peak weight versions per stage:";
    for (int n : r.peak_weight_versions) std::cout << ' ' << n;
    std::cout << '\n';
  }

  if (list) {
    std::cout << "\ninstruction lists ([g] = posted together as group g):\n";
    for (int s = 0; s < stages; ++s) {
      std::cout << "stage " << s << ":";
      int open = -1;
      for (const Instr& in : lists[static_cast<size_t>(s)]) {
        if (in.group != open) {
          if (open >= 0) std::cout << "]";
          if (in.group >= 0) std::cout << " [" << in.group << ":";
          open = in.group;
        }
        std::cout << ' ' << instr_string(in);
      }
      if (open >= 0) std::cout << "]";
      std::cout << '\n';
    }
  }

  if (!trace_path.empty()) {
    std::ofstream out(trace_path);
    if (!out) throw InputError(trace_path, "", "a file that can be written (--trace)");
    out << chrome_trace_json(r, 1000.0) << '\n';
    if (!out) throw InputError(trace_path, "", "a file that can be written (--trace)");
    std::cout << "trace: " << trace_path << '\n';
  }
  return 0;
}

}  // namespace strata
