// timeline_output.cc — a simulated timeline (SimResult) as a Chrome trace or as a text diagram
// (simulator.h).
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "schedules/simulator.h"

namespace strata {

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
