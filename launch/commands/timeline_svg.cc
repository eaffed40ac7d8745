#include "launch/commands/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>

#include "launch/args.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"
#include "schedules/schedule.h"

namespace strata {

using nlohmann::json;

const char* to_string(WorkKind k) {
  switch (k) {
    case WorkKind::kForward:
      return "forward";
    case WorkKind::kBackward:
      return "backward";
    case WorkKind::kWeight:
      return "weight";
    case WorkKind::kComm:
      return "comm";
    case WorkKind::kOptimizer:
      return "optimizer";
  }
  return "?";
}

namespace {

const char* colour(WorkKind k) {
  switch (k) {
    case WorkKind::kForward:
      return "#4e79a7";
    case WorkKind::kBackward:
      return "#f28e2b";
    case WorkKind::kWeight:
      return "#59a14f";
    case WorkKind::kComm:
      return "#e15759";
    case WorkKind::kOptimizer:
      return "#9c755f";
  }
  return "#000000";
}

// Memory categories: colours of their own (none of the work colours above), names as the legend
// spells them.
struct MemoryCategory {
  const char* key;
  const char* colour;
  const char* legend;
};
const MemoryCategory kMemoryCategories[] = {{"parameters", "#76b7b2", "parameters"},
                                            {"gradients", "#edc948", "gradients"},
                                            {"optimizer", "#b07aa1", "optimizer state"},
                                            {"activations", "#ff9da7", "activations"},
                                            {"buffers", "#bab0ac", "buffers"}};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        // Control bytes are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;
    }
  }
  return out;
}

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

// "12.5 ms", "1.25 s"
std::string duration(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.3g s", s);
  else
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  return buf;
}

// A tick of the time axis: its value in the unit its step reads best in ("0", "50 ms", "1.5 s").
std::string tick_time(double s, double step) {
  char buf[32];
  if (s == 0) return "0";
  if (step >= 0.5)
    std::snprintf(buf, sizeof buf, "%.6g s", s);
  else if (step >= 0.5e-3)
    std::snprintf(buf, sizeof buf, "%.6g ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.6g \u00b5s", s * 1e6);
  return buf;
}

std::string plain(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

std::string op_label(Op op, int mb, int chunk) {
  Instr in;
  in.op = op;
  in.mb = mb;
  in.chunk = chunk;
  return instr_string(in);
}

}  // namespace

TimelinePanel plan_panel(const PlanResult& plan, const IterationTime& timed, const Cluster& cl,
                         const std::string& title) {
  TimelinePanel p;
  p.title = title;
  const ParallelLayout& c = plan.config;
  p.rows.resize(static_cast<size_t>(c.pipeline));
  for (int s = 0; s < c.pipeline; ++s)
    p.rows[static_cast<size_t>(s)].label = "stage " + std::to_string(s);
  for (const TimelineEvent& e : timed.sim.timeline) {
    if (e.end <= e.start) continue;
    TimelineRow& row = p.rows[static_cast<size_t>(e.stage)];
    const size_t piece = static_cast<size_t>(e.chunk * c.pipeline + e.stage);
    const std::string label = op_label(e.op, e.mb, e.chunk);
    auto split = [&](WorkKind kind, double comm_share) {
      const double mid = e.end - (e.end - e.start) * comm_share;
      row.bars.push_back({e.start, mid, kind, label});
      if (mid < e.end) row.bars.push_back({mid, e.end, WorkKind::kComm, label + " comm"});
    };
    switch (e.op) {
      case Op::kForward:
        split(WorkKind::kForward,
              piece < timed.comm_share_fwd.size() ? timed.comm_share_fwd[piece] : 0.0);
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        split(WorkKind::kBackward,
              piece < timed.comm_share_bwd.size() ? timed.comm_share_bwd[piece] : 0.0);
        break;
      case Op::kBackwardWeight:
        row.bars.push_back({e.start, e.end, WorkKind::kWeight, label});
        break;
      case Op::kReduceGrads:
        row.bars.push_back({e.start, e.end, WorkKind::kComm, "data-parallel reduction"});
        break;
      default:
        row.bars.push_back({e.start, e.end, WorkKind::kOptimizer, "optimizer step"});
        break;
    }
    p.span_s = std::max(p.span_s, e.end);
  }
  for (size_t s = 0; s < plan.memory.size(); ++s) {
    const MemoryBreakdown& m = plan.memory[s];
    p.memory.push_back({"stage " + std::to_string(s),
                        {{"parameters", m.parameters},
                         {"gradients", m.gradients},
                         {"optimizer", m.optimizer},
                         {"activations", m.activations},
                         {"buffers", m.buffers}}});
  }
  p.memory_limit_bytes = cl.memory_bytes;
  return p;
}

TimelinePanel trace_panel(const json& trace, int iteration, const std::string& file) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw InputError(file, "traceEvents", "an array of trace events (a log.trace of strata train)");
  struct Event {
    double start, end;
    std::string cat, name;
  };
  std::map<int, std::vector<Event>> by_rank;  // rank → its events
  std::map<int, json> coords;                 // rank → its thread_name args (tp, pp, dp, cp)
  json run;                                   // the process_name args: the run's description
  for (size_t i = 0; i < trace["traceEvents"].size(); ++i) {
    const json& e = trace["traceEvents"][i];
    if (!e.is_object()) continue;
    if (e.value("ph", "") == "M" && e.contains("args") && e["args"].is_object()) {
      if (e.value("name", "") == "process_name") run = e["args"];
      if (e.value("name", "") == "thread_name" && e.contains("tid") && e["tid"].is_number())
        coords[e["tid"].get<int>()] = e["args"];
      continue;
    }
    if (e.value("ph", "") != "X") continue;
    const std::string where = "traceEvents[" + std::to_string(i) + "]";
    for (const char* k : {"tid", "ts", "dur"})
      if (!e.contains(k) || !e[k].is_number()) throw InputError(file, where + "." + k, "a number");
    if (!e.contains("cat") || !e["cat"].is_string())
      throw InputError(file, where + ".cat", "the instruction's kind (a string)");
    const double ts = e["ts"].get<double>() * 1e-6, dur = e["dur"].get<double>() * 1e-6;
    by_rank[e["tid"].get<int>()].push_back(
        {ts, ts + dur, e["cat"].get<std::string>(), e.value("name", std::string())});
  }
  if (by_rank.empty()) throw InputError(file, "traceEvents", "at least one complete (\"X\") event");
  // Iteration k of a rank ends with its k-th optimizer step.
  int complete = 1 << 30;
  for (auto& [rank, events] : by_rank) {
    std::sort(events.begin(), events.end(),
              [](const Event& a, const Event& b) { return a.start < b.start; });
    int steps = 0;
    for (const Event& e : events) steps += e.cat == "optimizer-step" ? 1 : 0;
    complete = std::min(complete, steps);
  }
  if (complete == 0)
    throw InputError(file, "traceEvents", "an optimizer step on every rank (a whole iteration)");
  const int k = iteration == 0 ? complete : iteration;
  if (k < 1 || k > complete)
    throw InputError("<command line>", "--iteration",
                     "an iteration from 1 to " + std::to_string(complete) + " (the trace's), got " +
                         std::to_string(iteration));
  TimelinePanel p;
  double t0 = 1e300, t1 = 0;
  std::map<int, std::pair<size_t, size_t>> window;  // rank → [first, last] event index
  for (auto& [rank, events] : by_rank) {
    int steps = 0;
    size_t first = 0, last = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      if (events[i].cat != "optimizer-step") continue;
      ++steps;
      if (steps == k - 1) first = i + 1;
      if (steps == k) {
        last = i;
        break;
      }
    }
    window[rank] = {first, last};
    t0 = std::min(t0, events[first].start);
    t1 = std::max(t1, events[last].end);
  }
  for (auto& [rank, events] : by_rank) {
    TimelineRow row;
    row.label = "rank " + std::to_string(rank);
    const auto at = coords.find(rank);
    if (at != coords.end()) {
      auto coord = [&](const char* key) {
        const json& a = at->second;
        return a.contains(key) && a[key].is_number_integer() ? a[key].get<int>() : -1;
      };
      row.tp = coord("tp");
      row.pp = coord("pp");
      row.dp = coord("dp");
      row.cp = coord("cp");
      if (row.tp >= 0 && row.pp >= 0 && row.dp >= 0) {
        row.label += ": tp " + std::to_string(row.tp) + " pp " + std::to_string(row.pp) + " dp " +
                     std::to_string(row.dp);
        const bool context = run.is_object() && run.contains("layout") &&
                             run["layout"].is_object() && run["layout"].value("context", 1) > 1;
        if (row.cp > 0 || context) row.label += " cp " + std::to_string(row.cp);
      }
    }
    for (size_t i = window[rank].first; i <= window[rank].second; ++i) {
      const Event& e = events[i];
      WorkKind kind = WorkKind::kOptimizer;
      if (e.cat == "forward")
        kind = WorkKind::kForward;
      else if (e.cat == "backward" || e.cat == "backward-input")
        kind = WorkKind::kBackward;
      else if (e.cat == "backward-weight")
        kind = WorkKind::kWeight;
      else if (e.cat.rfind("recv", 0) == 0 || e.cat.rfind("send", 0) == 0 ||
               e.cat == "reduce-grads")
        kind = WorkKind::kComm;
      row.bars.push_back({e.start - t0, e.end - t0, kind, e.name.empty() ? e.cat : e.name});
    }
    p.rows.push_back(row);
  }
  p.span_s = t1 - t0;
  p.run = run.is_object() ? run : json();
  p.title =
      "measured: " + file + ", iteration " + std::to_string(k) + " (" + duration(p.span_s) + ")";
  return p;
}

std::vector<double> round_ticks(double span, int most) {
  std::vector<double> ticks;
  if (!(span > 0) || most < 1) return {0};
  const double raw = span / most;
  double step = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * step >= raw * (1 - 1e-9)) {
      step *= m;
      break;
    }
  }
  for (int i = 0; i * step <= span * (1 + 1e-9); ++i) ticks.push_back(i * step);
  return ticks;
}

std::string timeline_svg(const std::vector<TimelinePanel>& panels) {
  const double timeline_w = 820, mem_gap = 40, mem_w = 220, right = 20, row_h = 22, row_gap = 6;
  double span = 0, mem_max = 0, limit = 0;
  size_t longest_label = 0;
  bool kinds[5] = {false, false, false, false, false}, any_row = false;
  std::vector<bool> categories(std::size(kMemoryCategories), false);
  for (const TimelinePanel& p : panels) {
    span = std::max(span, p.span_s);
    for (const TimelineRow& r : p.rows) {
      any_row = true;
      longest_label = std::max(longest_label, r.label.size());
      for (const WorkBar& b : r.bars) kinds[static_cast<int>(b.kind)] = true;
    }
    for (const MemoryBar& m : p.memory) {
      double total = 0;
      for (const auto& [cat, bytes] : m.parts) {
        total += bytes;
        for (size_t c = 0; c < categories.size(); ++c)
          if (cat == kMemoryCategories[c].key && bytes > 0) categories[c] = true;
      }
      mem_max = std::max(mem_max, total);
    }
    mem_max = std::max(mem_max, p.memory_limit_bytes);
    limit = std::max(limit, p.memory.empty() ? 0.0 : p.memory_limit_bytes);
  }
  const bool memory = mem_max > 0;
  if (span <= 0) span = 1;
  // Row labels left of the time axis: ~6.5 px a character at 12 px.
  const double left = std::max(120.0, 20 + 6.5 * static_cast<double>(longest_label));
  const double width = left + timeline_w + (memory ? mem_gap + mem_w : 0) + right;
  const std::vector<double> time_ticks = round_ticks(span, 6);
  const double time_step = time_ticks.size() > 1 ? time_ticks[1] : span;
  // The memory scale: round GiB ticks, the bars' full width the last tick at or above the most.
  const double kGiB = 1024.0 * 1024 * 1024;
  std::vector<double> mem_ticks = round_ticks(mem_max / kGiB, 4);
  if (memory && mem_ticks.back() * kGiB < mem_max * (1 - 1e-9))
    mem_ticks.push_back(mem_ticks.back() + (mem_ticks.size() > 1 ? mem_ticks[1] : 1));
  const double mem_scale = memory ? mem_ticks.back() * kGiB : 1;  // bytes at the bars' full width
  std::ostringstream body;
  const double legend_h = memory ? 52 : 30;
  double y = legend_h + 10;
  for (const TimelinePanel& p : panels) {
    body << "<g class=\"panel\">\n";
    body << "<text x=\"10\" y=\"" << num(y + 14) << "\" font-size=\"14\" font-weight=\"bold\">"
         << escape(p.title) << "</text>\n";
    y += 24;
    const double top = y;
    for (const TimelineRow& r : p.rows) {
      body << "<g class=\"row\" data-label=\"" << escape(r.label) << "\"";
      if (r.tp >= 0)
        body << " data-tp=\"" << r.tp << "\" data-pp=\"" << r.pp << "\" data-dp=\"" << r.dp
             << "\" data-cp=\"" << std::max(0, r.cp) << "\"";
      body << ">\n<text x=\"10\" y=\"" << num(y + 15) << "\" font-size=\"12\">" << escape(r.label)
           << "</text>\n";
      // Idle: the row's background.
      body << "<rect class=\"idle\" x=\"" << num(left) << "\" y=\"" << num(y) << "\" width=\""
           << num(timeline_w * p.span_s / span) << "\" height=\"" << num(row_h)
           << "\" fill=\"#eeeeee\"/>\n";
      for (const WorkBar& b : r.bars) {
        const double x = left + timeline_w * b.start_s / span;
        const double w = std::max(0.5, timeline_w * (b.end_s - b.start_s) / span);
        body << "<rect class=\"" << to_string(b.kind) << "\" x=\"" << num(x) << "\" y=\"" << num(y)
             << "\" width=\"" << num(w) << "\" height=\"" << num(row_h) << "\" fill=\""
             << colour(b.kind) << "\"><title>" << escape(b.label) << ": "
             << duration(b.end_s - b.start_s) << " at " << duration(b.start_s)
             << "</title></rect>\n";
      }
      body << "</g>\n";
      y += row_h + row_gap;
    }
    // Time axis: round ticks of the common scale.
    body << "<g class=\"axis\">\n";
    for (double t : time_ticks) {
      const double x = left + timeline_w * t / span;
      body << "<line x1=\"" << num(x) << "\" y1=\"" << num(top - 2) << "\" x2=\"" << num(x)
           << "\" y2=\"" << num(y) << "\" stroke=\"#999999\" stroke-width=\"0.5\"/>\n";
      body << "<text class=\"tick\" x=\"" << num(x) << "\" y=\"" << num(y + 12)
           << "\" font-size=\"10\" text-anchor=\"middle\">" << tick_time(t, time_step)
           << "</text>\n";
    }
    body << "</g>\n";
    // Memory per stage, stacked, on its own GiB scale, against the device's memory.
    if (!p.memory.empty() && memory) {
      const double mx = left + timeline_w + mem_gap;
      const double bar_h = std::max(6.0, (y - top - row_gap) / p.memory.size() - 4);
      double my = top;
      for (const MemoryBar& m : p.memory) {
        body << "<g class=\"memory\" data-label=\"" << escape(m.label) << "\">\n";
        double x = mx, total = 0;
        for (const auto& [cat, bytes] : m.parts) {
          const char* fill = "#cccccc";
          for (const MemoryCategory& c : kMemoryCategories)
            if (cat == c.key) fill = c.colour;
          const double w = mem_w * bytes / mem_scale;
          if (bytes > 0)
            body << "<rect class=\"" << escape(cat) << "\" x=\"" << num(x) << "\" y=\"" << num(my)
                 << "\" width=\"" << num(w) << "\" height=\"" << num(bar_h) << "\" fill=\"" << fill
                 << "\"><title>" << escape(m.label) << " " << escape(cat) << ": " << gib(bytes)
                 << "</title></rect>\n";
          x += w;
          total += bytes;
        }
        body << "<title>" << escape(m.label) << ": " << gib(total) << "</title>\n</g>\n";
        my += bar_h + 4;
      }
      body << "<g class=\"memory-axis\">\n";
      for (double g : mem_ticks) {
        const double x = mx + mem_w * g * kGiB / mem_scale;
        body << "<line x1=\"" << num(x) << "\" y1=\"" << num(top - 2) << "\" x2=\"" << num(x)
             << "\" y2=\"" << num(y) << "\" stroke=\"#999999\" stroke-width=\"0.5\"/>\n";
        body << "<text class=\"tick\" x=\"" << num(x) << "\" y=\"" << num(y + 12)
             << "\" font-size=\"10\" text-anchor=\"middle\">" << plain(g) << "</text>\n";
      }
      body << "<text x=\"" << num(mx + mem_w / 2) << "\" y=\"" << num(y + 24)
           << "\" font-size=\"10\" text-anchor=\"middle\">memory per stage, GiB";
      if (p.memory_limit_bytes > 0)
        body << " (line: the device's " << plain(p.memory_limit_bytes / kGiB) << ")";
      body << "</text>\n</g>\n";
      if (p.memory_limit_bytes > 0) {
        const double lx = mx + mem_w * p.memory_limit_bytes / mem_scale;
        body << "<line class=\"memory-limit\" x1=\"" << num(lx) << "\" y1=\"" << num(top - 4)
             << "\" x2=\"" << num(lx) << "\" y2=\"" << num(my - 2)
             << "\" stroke=\"#000000\" stroke-width=\"1.5\"/>\n";
      }
      y += 12;
    }
    body << "</g>\n";
    y += 30;
  }
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(width)
      << "\" height=\"" << num(y) << "\" viewBox=\"0 0 " << num(width) << " " << num(y)
      << "\" font-family=\"sans-serif\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n<g class=\"legend\">\n";
  auto entry = [&svg](double x, double y0, const char* kind, const char* fill, const char* text,
                      const char* stroke) {
    svg << "<g class=\"legend-item\" data-kind=\"" << kind << "\"><rect x=\"" << num(x) << "\" y=\""
        << num(y0) << "\" width=\"12\" height=\"12\" fill=\"" << fill << "\""
        << (stroke ? std::string(" stroke=\"") + stroke + "\"" : std::string()) << "/><text x=\""
        << num(x + 16) << "\" y=\"" << num(y0 + 10) << "\" font-size=\"12\">" << text
        << "</text></g>\n";
  };
  // Only what the picture holds: the kinds of work drawn, the memory categories present.
  svg << "<g class=\"legend-work\">\n<text x=\"10\" y=\"22\" font-size=\"12\" "
      << "font-weight=\"bold\">work</text>\n";
  double lx = 70;
  for (WorkKind k : {WorkKind::kForward, WorkKind::kBackward, WorkKind::kWeight, WorkKind::kComm,
                     WorkKind::kOptimizer}) {
    if (!kinds[static_cast<int>(k)]) continue;
    entry(lx, 12, to_string(k), colour(k), to_string(k), nullptr);
    lx += 95;
  }
  if (any_row) entry(lx, 12, "idle", "#eeeeee", "idle", "#cccccc");
  svg << "</g>\n";
  if (memory) {
    svg << "<g class=\"legend-memory\">\n<text x=\"10\" y=\"44\" font-size=\"12\" "
        << "font-weight=\"bold\">memory</text>\n";
    lx = 70;
    for (size_t c = 0; c < categories.size(); ++c) {
      if (!categories[c]) continue;
      const MemoryCategory& m = kMemoryCategories[c];
      entry(lx, 34, m.key, m.colour, m.legend, nullptr);
      lx += 125;
    }
    if (limit > 0)
      svg << "<g class=\"legend-item\" data-kind=\"memory-limit\"><line x1=\"" << num(lx + 6)
          << "\" y1=\"33\" x2=\"" << num(lx + 6) << "\" y2=\"47\" stroke=\"#000000\" "
          << "stroke-width=\"1.5\"/><text x=\"" << num(lx + 16)
          << "\" y=\"44\" font-size=\"12\">the device's memory</text></g>\n";
    svg << "</g>\n";
  }
  svg << "</g>\n" << body.str() << "</svg>\n";
  return svg.str();
}

namespace {

const char* kTraceSvgUsage =
    "usage: strata trace-svg --trace LOG.trace --out OUT.svg [--iteration N]\n"
    "\n"
    "Draws one iteration of a run's log.trace (the Chrome trace strata train writes with\n"
    "log.trace set): a row per rank (with its tp, pp, dp coordinates when the trace records\n"
    "them), its forward, backward, weight-gradient, communication\n"
    "(receive waits, the data-parallel reduction) and optimizer work, idle time bare. The\n"
    "planner's prediction is drawn by the same code: strata plan --svg OUT [--measured\n"
    "LOG.trace] puts the two one above the other on one time scale (docs/planner.md).\n"
    "\n"
    "options:\n"
    "  --trace FILE     the run's log.trace\n"
    "  --out FILE       the SVG to write\n"
    "  --iteration N    which iteration (1-based; default: the last complete one)\n"
    "  --help           this text\n"
    "\n"
    "exit status: 0 done, 2 bad input (one line: error: <file>: <where>: <expected>)\n";

}  // namespace

int cmd_trace_svg(const std::vector<std::string>& args) {
  std::string trace, out;
  int iteration = 0;
  if (!read_flags(args,
                  {text_flag("--trace", &trace), text_flag("--out", &out),
                   positive_flag("--iteration", &iteration)},
                  kTraceSvgUsage, "an option of strata trace-svg (see strata trace-svg --help)"))
    return 0;
  if (trace.empty()) bad_flag("--trace", "a trace: strata trace-svg --trace LOG.trace --out OUT");
  if (out.empty()) bad_flag("--out", "an output file: --out OUT.svg");
  check_output_flag("--out", out);
  const TimelinePanel p = trace_panel(read_json_file(trace), iteration, trace);
  std::ofstream f(out);
  f << timeline_svg({p});
  if (!f) bad_flag("--out", "a writable path, got " + out);
  std::printf("strata trace-svg: %s, %zu rank(s), iteration of %s -> %s\n", trace.c_str(),
              p.rows.size(), duration(p.span_s).c_str(), out.c_str());
  return 0;
}

}  // namespace strata
