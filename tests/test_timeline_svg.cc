// The timeline picture (launch/commands/timeline_svg.h): `strata plan --svg` draws the chosen
// plan's predicted iteration and `strata trace-svg` a measured run's log.trace; each output is
// parsed as XML by Python's standard library (python3 is one of scripts/deps's packages) and
// must hold the expected rows: a row per pipeline stage for the plan, a row per rank for the
// trace, the memory bars of every stage, and bars of the expected kinds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "launch/commands/plan.h"
#include "launch/commands/timeline_svg.h"
#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

// Parses `svg` with xml.etree; returns "row labels|memory labels|bar classes" (each part
// space-separated, sorted and unique for the classes), or "error: ..." when it is not XML.
std::string parse_svg(const std::string& svg) {
  const std::string script =
      "import sys, xml.etree.ElementTree as E\n"
      "try:\n"
      "    root = E.parse(sys.argv[1]).getroot()\n"
      "except Exception as e:\n"
      "    print('error: %s' % e); sys.exit(0)\n"
      "ns = '{http://www.w3.org/2000/svg}'\n"
      "assert root.tag == ns + 'svg', root.tag\n"
      "groups = list(root.iter(ns + 'g'))\n"
      "rows = [g.get('data-label').replace(' ', '_') for g in groups if g.get('class') == 'row']\n"
      "mem = [g.get('data-label').replace(' ', '_') for g in groups if g.get('class') == "
      "'memory']\n"
      "bars = sorted({r.get('class') for g in groups if g.get('class') == 'row'\n"
      "               for r in g.iter(ns + 'rect') if r.get('class') != 'idle'})\n"
      "print(' '.join(rows) + '|' + ' '.join(mem) + '|' + ' '.join(bars))\n";
  // Names of this process's own: ctest -j runs the tests of this file side by side, in one
  // temporary directory.
  const std::string dir = ::testing::TempDir(), tag = std::to_string(::getpid());
  const std::string py = dir + "/check_svg_" + tag + ".py", file = dir + "/checked_" + tag + ".svg";
  std::ofstream(py) << script;
  std::ofstream(file) << svg;
  FILE* p = ::popen(("python3 " + py + " " + file).c_str(), "r");
  if (p == nullptr) return "error: no python3";
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// What a reader sees in `svg`, parsed with xml.etree: the legend's work and memory entries
// ({kind: fill}), the fills the bars and memory rects use, the time and memory axes' tick labels,
// each row's label and coordinates, the picture's width and the right end of its last bar.
nlohmann::json svg_facts(const std::string& svg) {
  const std::string script =
      "import sys, json, xml.etree.ElementTree as E\n"
      "ns = '{http://www.w3.org/2000/svg}'\n"
      "root = E.parse(sys.argv[1]).getroot()\n"
      "groups = list(root.iter(ns + 'g'))\n"
      "def of(cls): return [g for g in groups if g.get('class') == cls]\n"
      "def legend(cls):\n"
      "    return {i.get('data-kind'): (i.find(ns + 'rect').get('fill') if i.find(ns + 'rect')\n"
      "            is not None else None) for g in of(cls) for i in g.iter(ns + 'g')\n"
      "            if i.get('class') == 'legend-item'}\n"
      "def ticks(cls): return [[t.text for t in g.iter(ns + 'text') if t.get('class') == "
      "'tick'] for g in of(cls)]\n"
      "bars = [r for g in of('row') for r in g.iter(ns + 'rect') if r.get('class') != 'idle']\n"
      "print(json.dumps({\n"
      "  'legend_work': legend('legend-work'), 'legend_memory': legend('legend-memory'),\n"
      "  'work_fills': sorted({r.get('fill') for r in bars}),\n"
      "  'memory_fills': sorted({r.get('fill') for g in of('memory') for r in "
      "g.iter(ns + 'rect')}),\n"
      "  'time_ticks': ticks('axis'), 'memory_ticks': ticks('memory-axis'),\n"
      "  'rows': [{k: g.get(k) for k in ('data-label', 'data-tp', 'data-pp', 'data-dp')} "
      "for g in of('row')],\n"
      "  'width': float(root.get('width')),\n"
      "  'last_bar_end': max([float(r.get('x')) + float(r.get('width')) for r in bars] or "
      "[0])}))\n";
  const std::string dir = ::testing::TempDir(), tag = std::to_string(::getpid());
  const std::string py = dir + "/svg_facts_" + tag + ".py", file = dir + "/facts_" + tag + ".svg";
  std::ofstream(py) << script;
  std::ofstream(file) << svg;
  FILE* p = ::popen(("python3 " + py + " " + file).c_str(), "r");
  if (p == nullptr) return nullptr;
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ::pclose(p);
  return nlohmann::json::parse(out, nullptr, false);
}

// A tick label's number ("50 ms" -> 50, "0" -> 0).
double tick_value(const std::string& label) {
  return std::stod(label);
}

// Whether `x` (> 0) is 1, 2 or 5 × 10^k.
bool round_step(double x) {
  const double k = std::pow(10.0, std::floor(std::log10(x) + 1e-9));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (std::abs(x - m * k) < 1e-6 * x) return true;
  return false;
}

// The labels of an axis start at 0 and go up in one round step, whatever their unit.
void expect_round_ticks(const nlohmann::json& labels, const std::string& what) {
  ASSERT_GE(labels.size(), 3u) << what << ": " << labels;
  EXPECT_EQ(labels[0], "0") << what;
  const double step = tick_value(labels[1]);
  EXPECT_TRUE(round_step(step)) << what << ": step " << step << " in " << labels;
  for (size_t i = 1; i < labels.size(); ++i)
    EXPECT_NEAR(tick_value(labels[i]), step * static_cast<double>(i), 1e-6 * step)
        << what << ": " << labels;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// strata plan --svg: four pipeline stages, each with its row and its memory bar; forward,
// backward and optimizer work drawn, communication where the runtime exposes it.
TEST(TimelineSvg, PlanDrawsARowAndAMemoryBarPerStage) {
  const std::string out = ::testing::TempDir() + "/plan.svg";
  ::testing::internal::CaptureStdout();
  const int status = cmd_plan({"--model", "gpt3-13b", "--cluster", "dgx-a100-80gb", "--nodes", "4",
                               "--global-batch-size", "128", "--fix",
                               "tensor=8,pipeline=4,schedule=1f1b", "--top", "1", "--svg", out});
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0);
  EXPECT_NE(printed.find("svg: the chosen plan's predicted iteration -> " + out), std::string::npos)
      << printed;  // says where it wrote
  EXPECT_EQ(parse_svg(read(out)),
            "stage_0 stage_1 stage_2 stage_3|stage_0 stage_1 stage_2 stage_3|backward comm "
            "forward optimizer");
  const nlohmann::json f = svg_facts(read(out));
  ASSERT_TRUE(f.is_object()) << "not parsed";
  // The legend: the kinds drawn (no weight passes in 1F1B), and a memory section of its own
  // whose colours are none of the work's, and are the colours the memory bars use.
  EXPECT_EQ(f["legend_work"].size(), 5u) << f["legend_work"];  // 4 kinds and idle
  EXPECT_FALSE(f["legend_work"].contains("weight")) << f["legend_work"];
  const nlohmann::json& mem = f["legend_memory"];
  for (const char* k : {"parameters", "gradients", "optimizer", "activations"})
    EXPECT_TRUE(mem.contains(k)) << k << " missing from " << mem;
  std::set<std::string> work_fills, mem_fills;
  for (const auto& [k, fill] : f["legend_work"].items()) work_fills.insert(fill);
  for (const auto& [k, fill] : mem.items())
    if (!fill.is_null()) mem_fills.insert(fill);
  for (const std::string& c : mem_fills)
    EXPECT_EQ(work_fills.count(c), 0u) << c << " is both a kind of work and of memory";
  for (const auto& c : f["memory_fills"])
    EXPECT_EQ(mem_fills.count(c.get<std::string>()), 1u) << c << " is not in the memory legend";
  for (const auto& c : f["work_fills"])
    EXPECT_EQ(work_fills.count(c.get<std::string>()), 1u) << c << " is not in the work legend";
  // Round ticks on both axes: time (in whatever unit) and memory (GiB).
  ASSERT_EQ(f["time_ticks"].size(), 1u);
  expect_round_ticks(f["time_ticks"][0], "time axis");
  ASSERT_EQ(f["memory_ticks"].size(), 1u) << "a memory scale";
  expect_round_ticks(f["memory_ticks"][0], "memory axis");
}

// The picture renders: rsvg-convert (librsvg2-bin, scripts/deps) turns it into a PNG of the
// SVG's size (what scripts/render_pictures does for a person to look at).
TEST(TimelineSvg, RendersToPng) {
  if (std::system("command -v rsvg-convert > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert not found (Debian package librsvg2-bin): render not checked";
  const std::string svg = ::testing::TempDir() + "/render.svg", png = svg + ".png";
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(cmd_plan({"--model", "gpt2-124m", "--cluster", "dgx-h100", "--global-batch-size", "64",
                      "--fix", "tensor=1,pipeline=2,schedule=zb-h1", "--top", "1", "--svg", svg}),
            0);
  ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(std::system(("rsvg-convert -o " + png + " " + svg).c_str()), 0);
  const std::string bytes = read(png);
  ASSERT_GT(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 8), "\x89PNG\r\n\x1a\n");
  // The PNG's width (IHDR, big-endian at byte 16) is the SVG's.
  const auto u = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned width = u(16) << 24 | u(17) << 16 | u(18) << 8 | u(19);
  EXPECT_NEAR(width, svg_facts(read(svg))["width"].get<double>(), 1.0);
}

// The tick steps: round numbers, at most the intervals asked for, up to the span.
TEST(TimelineSvg, RoundTicks) {
  EXPECT_EQ(round_ticks(1.0, 4), (std::vector<double>{0, 0.5, 1.0}));
  const std::vector<double> t = round_ticks(0.0731, 6);  // 73.1 ms: steps of 20 ms
  ASSERT_EQ(t.size(), 4u);
  EXPECT_NEAR(t[1], 0.02, 1e-12);
  EXPECT_NEAR(t.back(), 0.06, 1e-12);
  EXPECT_EQ(round_ticks(80, 4), (std::vector<double>{0, 20, 40, 60, 80}));
  EXPECT_EQ(round_ticks(81, 4), (std::vector<double>{0, 50}));  // the caller adds 100
}

// A zero-bubble plan draws its weight passes as their own kind.
TEST(TimelineSvg, ZeroBubblePlanDrawsWeightPasses) {
  const std::string out = ::testing::TempDir() + "/zb.svg";
  ::testing::internal::CaptureStdout();
  const int status =
      cmd_plan({"--model", "gpt2-124m", "--cluster", "dgx-h100", "--global-batch-size", "64",
                "--fix", "tensor=1,pipeline=2,schedule=zb-h1", "--top", "1", "--svg", out});
  ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0);
  const std::string parsed = parse_svg(read(out));
  EXPECT_EQ(parsed.substr(0, parsed.find('|')), "stage_0 stage_1") << parsed;
  EXPECT_NE(parsed.find("weight"), std::string::npos) << parsed;
}

// A measured run's log.trace (strata train, one rank): a row for the rank, the iteration's
// forward, backward, reduction and step; and the same trace beside a plan in one picture.
TEST(TimelineSvg, TraceOfARealRunAndThePlanSideBySide) {
  const std::string trace = ::testing::TempDir() + "/run.trace";
  const Config cfg =
      load_config("", {"model.preset=tiny", "model.num_layers=2", "train.iterations=3",
                       "train.eval_interval=0", "train.micro_batch_size=2",
                       "train.global_batch_size=4", "train.threads=1", "log.trace=" + trace});
  RunContext quiet;
  quiet.verbose = false;
  run_training(cfg, quiet);
  const std::string out = ::testing::TempDir() + "/trace.svg";
  ASSERT_EQ(cmd_trace_svg({"--trace", trace, "--out", out, "--iteration", "2"}), 0);
  EXPECT_EQ(parse_svg(read(out)), "rank_0:_tp_0_pp_0_dp_0||backward comm forward optimizer");

  const std::string model = ::testing::TempDir() + "/tiny_model.json";
  std::ofstream(model) << nlohmann::json{{"preset", "tiny"}, {"num_layers", 2}}.dump();
  const std::string both = ::testing::TempDir() + "/both.svg";
  // The run's own layout on its own kind of device: no warning.
  auto plan = [&](const std::string& cluster, const std::string& batch, const std::string& fix,
                  std::string* err) {
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    const int status = cmd_plan({"--model", model, "--cluster", cluster, "--precision", "fp32",
                                 "--global-batch-size", batch, "--fix", fix, "--top", "1", "--svg",
                                 both, "--measured", trace});
    ::testing::internal::GetCapturedStdout();
    *err = ::testing::internal::GetCapturedStderr();
    return status;
  };
  std::string err;
  ASSERT_EQ(plan("cpu-local", "4", "tensor=1,pipeline=1,micro_batch_size=2,recompute=none", &err),
            0);
  EXPECT_EQ(err, "");
  const std::string parsed = parse_svg(read(both));
  EXPECT_EQ(parsed.substr(0, parsed.find('|')), "stage_0 rank_0:_tp_0_pp_0_dp_0") << parsed;
  // Another micro-batch size: one warning line naming what differs, and the picture still drawn.
  ASSERT_EQ(plan("cpu-local", "4", "tensor=1,pipeline=1,micro_batch_size=1,recompute=none", &err),
            0);
  EXPECT_EQ(err.rfind("warning: --measured " + trace + ": the run differs", 0), 0u) << err;
  EXPECT_NE(err.find("micro_batch_size 2 (plan 1)"), std::string::npos) << err;
  EXPECT_NE(err.find("num_microbatches 2 (plan 4)"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  // Another kind of device (the run was on the CPU; 8 GPUs: a batch of 16 for data 8): named too.
  ASSERT_EQ(plan("dgx-h100", "16", "tensor=1,pipeline=1,micro_batch_size=2,recompute=none", &err),
            0);
  EXPECT_NE(err.find("device cpu (plan: cluster dgx-h100, a gpu)"), std::string::npos) << err;
}

// Two ranks of a pipeline, as strata train writes them (tid = world rank): a row per rank, the
// receive waits as communication; an iteration the trace does not have is refused.
TEST(TimelineSvg, TwoRankTraceAndItsRefusals) {
  nlohmann::json events = nlohmann::json::array();
  auto add = [&](int rank, const char* cat, const char* name, double ts, double dur) {
    events.push_back({{"name", name},
                      {"cat", cat},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", rank},
                      {"ts", ts},
                      {"dur", dur}});
  };
  for (int it = 0; it < 2; ++it) {
    const double t = it * 1000;
    add(0, "forward", "F0", t, 100);
    add(0, "backward", "B0", t + 300, 200);
    add(0, "reduce-grads", "R", t + 500, 10);
    add(0, "optimizer-step", "S", t + 510, 50);
    add(1, "recv-activation", "RA0", t, 100);
    add(1, "forward", "F0", t + 100, 100);
    add(1, "backward", "B0", t + 200, 200);
    add(1, "optimizer-step", "S", t + 510, 50);
  }
  const std::string trace = ::testing::TempDir() + "/two.trace";
  std::ofstream(trace) << nlohmann::json{{"traceEvents", events}}.dump();
  const std::string out = ::testing::TempDir() + "/two.svg";
  ASSERT_EQ(cmd_trace_svg({"--trace", trace, "--out", out}), 0);
  EXPECT_EQ(parse_svg(read(out)), "rank_0 rank_1||backward comm forward optimizer");
  // Only the kinds drawn in the legend (no weight passes here), no memory section, and no blank
  // memory column: the last operation ends at the time axis's end, a margin from the right edge.
  nlohmann::json f = svg_facts(read(out));
  ASSERT_TRUE(f.is_object());
  EXPECT_EQ(f["legend_work"].size(), 5u) << f["legend_work"];
  EXPECT_FALSE(f["legend_work"].contains("weight")) << f["legend_work"];
  EXPECT_TRUE(f["legend_memory"].empty()) << f["legend_memory"];
  EXPECT_TRUE(f["memory_ticks"].empty());
  EXPECT_GT(f["last_bar_end"].get<double>(), f["width"].get<double>() - 25) << f.dump();
  expect_round_ticks(f["time_ticks"][0], "time axis");
  // With the metadata strata train writes first, each row names its tensor, pipeline and data
  // coordinates (pipeline 2 here: rank 1 is stage 1).
  nlohmann::json with_meta = nlohmann::json::array();
  for (int r = 0; r < 2; ++r)
    with_meta.push_back({{"name", "thread_name"},
                         {"ph", "M"},
                         {"pid", 0},
                         {"tid", r},
                         {"args", {{"name", "rank"}, {"tp", 0}, {"pp", r}, {"dp", 0}, {"cp", 0}}}});
  for (const auto& e : events) with_meta.push_back(e);
  std::ofstream(trace) << nlohmann::json{{"traceEvents", with_meta}}.dump();
  ASSERT_EQ(cmd_trace_svg({"--trace", trace, "--out", out}), 0);
  f = svg_facts(read(out));
  ASSERT_EQ(f["rows"].size(), 2u);
  EXPECT_EQ(f["rows"][1]["data-label"], "rank 1: tp 0 pp 1 dp 0");
  EXPECT_EQ(f["rows"][1]["data-tp"], "0");
  EXPECT_EQ(f["rows"][1]["data-pp"], "1");
  EXPECT_EQ(f["rows"][1]["data-dp"], "0");
  try {
    cmd_trace_svg({"--trace", trace, "--out", out, "--iteration", "3"});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "--iteration");
    EXPECT_NE(e.expected().find("from 1 to 2"), std::string::npos) << e.what();
  }
  std::ofstream(trace) << R"({"traceEvents": [{"ph": "X", "tid": 0, "ts": 1}]})";
  try {
    cmd_trace_svg({"--trace", trace, "--out", out});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "traceEvents[0].dur");
  }
}

}  // namespace
}  // namespace strata
