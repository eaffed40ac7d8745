// The timeline picture (launch/commands/timeline_svg.h): `strata plan --svg` draws the chosen
// plan's predicted iteration and `strata trace-svg` a measured run's log.trace; each output is
// parsed as XML by Python's standard library (python3 is one of scripts/deps's packages) and
// must hold the expected rows: a row per pipeline stage for the plan, a row per rank for the
// trace, the memory bars of every stage, and bars of the expected kinds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
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
  EXPECT_EQ(parse_svg(read(out)), "rank_0||backward comm forward optimizer");

  const std::string model = ::testing::TempDir() + "/tiny_model.json";
  std::ofstream(model) << nlohmann::json{{"preset", "tiny"}, {"num_layers", 2}}.dump();
  const std::string both = ::testing::TempDir() + "/both.svg";
  ::testing::internal::CaptureStdout();
  const int status = cmd_plan({"--model", model, "--cluster", "cpu-local", "--precision", "fp32",
                               "--global-batch-size", "4", "--fix",
                               "tensor=1,pipeline=1,micro_batch_size=2,recompute=none", "--top",
                               "1", "--svg", both, "--measured", trace});
  ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0);
  const std::string parsed = parse_svg(read(both));
  EXPECT_EQ(parsed.substr(0, parsed.find('|')), "stage_0 rank_0") << parsed;
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
