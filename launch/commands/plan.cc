#include "launch/commands/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "launch/args.h"
#include "launch/commands/timeline_svg.h"
#include "launch/config/config_parse.h"
#include "launch/config/layout_fields.h"
#include "launch/plan/prediction.h"
#include "models/registry.h"
#include "partitioner/cost_model.h"
#include "partitioner/figures.h"
#include "partitioner/layer_split.h"
#include "partitioner/planner.h"
#include "runtime/base/error.h"
#include "runtime/base/operation.h"
#include "runtime/io/json_file.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

using nlohmann::json;

const char* kPlanUsage =
    "usage: strata plan --model FILE|PRESET --cluster FILE|PRESET [--global-batch-size B]\n"
    "                   [--nodes N] [--fix k=v,...] [--top K] [--json OUT] [--trace OUT]\n"
    "                   [--seq-len S] [--precision bf16|fp32] [--profile PROFILE.json]\n"
    "                   [--svg OUT [--measured LOG.trace [--iteration N]]]\n"
    "\n"
    "Searches tensor, context, pipeline, data and (for a mixture of experts) expert parallel\n"
    "sizes, virtual stages, micro-batch size, schedule, recomputation, sequence parallelism\n"
    "and the distributed optimizer for the fastest layout that fits in memory; prints the\n"
    "best plans, then the chosen plan's per-stage layers and memory. Cost and memory model:\n"
    "docs/planner.md.\n"
    "\n"
    "options:\n"
    "  --model M              a preset (gpt2-124m, gpt3-175b, ...), a JSON model object, or\n"
    "                         a whole config (its model section, and from its train\n"
    "                         section the precision, the global batch and a micro_batch_size\n"
    "                         it sets, where the flags do not give them)\n"
    "  --cluster C            a preset (dgx-a100-80gb, dgx-h100, p3.16xlarge, cpu-local) or a\n"
    "                         JSON file, e.g. one written by strata profile --cluster-out\n"
    "  --global-batch-size B  sequences per iteration (needed unless --model is a config)\n"
    "  --nodes N              override the cluster's node count\n"
    "  --fix k=v,...          pin plan fields, each value as in a config: tensor, context,\n"
    "                         expert, pipeline, data, virtual_stages, schedule,\n"
    "                         layers_per_stage (e.g. [3,3,2]), sequence_parallel,\n"
    "                         distributed_optimizer, micro_batch_size, recompute; the rest is\n"
    "                         searched\n"
    "  --top K                plans to print (default 5)\n"
    "  --json OUT             write the plans and the rejected families as JSON\n"
    "  --trace OUT            write the chosen plan's simulated timeline as a Chrome trace\n"
    "  --svg OUT              draw the chosen plan's predicted iteration (a row per stage:\n"
    "                         forward, backward, weight, communication, optimizer, idle) and\n"
    "                         each stage's memory as a stacked bar, as an SVG\n"
    "  --measured LOG.trace   with --svg: also draw a run's log.trace (strata train) below it,\n"
    "                         on the same time scale; --iteration N picks its iteration\n"
    "                         (default: the last complete one); a warning on stderr when\n"
    "                         the run's layout, device or model is not the plan's\n"
    "  --seq-len S            override the model's sequence length\n"
    "  --precision P          bf16 (default) or fp32\n"
    "  --profile FILE         measured per-layer times (strata profile) instead of the\n"
    "                         analytical compute model\n"
    "  --help                 this text\n"
    "\n"
    "When nothing fits, the rejected families are listed by reason and a bottom line says\n"
    "the smallest change that fits (a pin released, or more nodes), each found by searching.\n"
    "\n"
    "exit status: 0 done (also when nothing fits: the reasons and the bottom line are\n"
    "printed), 2 bad input (also when the pins leave no layout to try: one line says why)\n";

// --model: a file (a model object or a whole config), else a preset name.
Config model_config(const std::string& model, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(model, ec)) {
    const json j = read_json_file(model);
    if (!j.is_object()) throw InputError(model, "", "a JSON object (a model or a config)");
    if (j.contains("model")) return load_config(model, sets);
    return config_from_json(json{{"model", j}}, model, sets);
  }
  return config_from_json(json{{"model", {{"preset", model}}}}, "<command line>", sets);
}

// "t=8 c=2 p=4 interleaved" for a family's config.
std::string family_text(const json& f) {
  const int cp = f.value("context", 1);
  return "t=" + std::to_string(f.value("tensor", 1)) +
         (cp > 1 ? " c=" + std::to_string(cp) : std::string()) +
         " p=" + std::to_string(f.value("pipeline", 1)) + " " + f.value("schedule", std::string());
}

// The rejected families as printed, one line per reason: a family alone with its own reason
// ("t=8 p=2 1f1b: over memory by ..."), several as "12 families: <their shared reason>"; the
// pins' reason when they leave no family at all.
struct RefusalLine {
  int families = 0;
  std::string text;
};
std::vector<RefusalLine> refusal_lines(const PlanOutput& out) {
  std::vector<RefusalLine> lines;
  std::string last_group;
  for (const Rejection& r : out.rejected) {
    if (r.config.contains("micro_batch_size")) continue;  // a plan of the exact pass
    if (r.config.empty()) {
      lines.push_back({0, r.reason});
      continue;
    }
    if (!lines.empty() && lines.back().families > 0 && r.group == last_group) {
      lines.back().families++;
      lines.back().text = r.group;
      continue;
    }
    lines.push_back({1, family_text(r.config) + ": " + r.reason});
    last_group = r.group;
  }
  for (RefusalLine& l : lines)
    if (l.families > 1) l.text = std::to_string(l.families) + " families: " + l.text;
  return lines;
}

void print_rejections(const PlanOutput& out, std::ostream& os) {
  for (const RefusalLine& l : refusal_lines(out)) os << "  " << l.text << "\n";
}

void print_table(const PlanRequest& req, const PlanOutput& out, std::ostream& os) {
  char buf[256];
  const ModelDescription& model = *req.model;
  os << "model: " << req.model_name << " (" << count_text(model.parameters(), "parameters") << ", "
     << model.num_layers() << " layers, hidden " << model.hidden_size() << ", seq "
     << model.seq_len() << ", vocab " << model.vocab_size() << ")\n";
  os << "cluster: " << req.cluster.name << ", " << req.cluster.nodes << " × "
     << req.cluster.gpus_per_node << " GPUs, " << bytes_text(req.cluster.memory_bytes) << " each, "
     << req.precision << " peak " << three(req.cluster.peak(req.precision) / 1e12) << " TFLOP/s\n";
  const double mf = model.flops_per_iteration(req.global_batch_size, Recompute::kNone).model;
  os << "global batch " << req.global_batch_size << ": model FLOPs per iteration " << flop_text(mf)
     << " (hardware FLOPs add the recomputed forward passes)\n";
  os << "searched " << out.candidates << " configurations in " << seconds_text(out.search_s)
     << "\n\n";
  // A mixture's plans add the expert size e after d, and plans that split sequences the context
  // size c after t (a dense model's table without context is as before).
  const bool moe = model.num_experts() > 0;
  bool context = false;
  for (const PlanResult& r : out.plans) context = context || r.config.context > 1;
  auto column = [](bool shown, const std::string& text) {
    char col[16];
    std::snprintf(col, sizeof col, " %3s", text.c_str());
    return shown ? std::string(col) : std::string();
  };
  if (out.plans.empty()) {
    os << "no plan fits; reasons by family (tensor, context, pipeline, schedule):\n";
    print_rejections(out, os);
    for (size_t i = 0; i < out.bottom_line.size(); ++i)
      os << (i == 0 ? "bottom line: " : "         or: ") << out.bottom_line[i] << "\n";
  } else {
    std::snprintf(buf, sizeof buf,
                  "%-3s %3s%s %3s %5s%s %3s %3s %5s %-12s %-9s %2s %4s %10s %8s %6s %10s %7s\n",
                  "#", "t", column(context, "c").c_str(), "p", "d", column(moe, "e").c_str(), "v",
                  "b", "m", "schedule", "recompute", "sp", "dopt", "iter_s", "TFLOP/s", "MFU",
                  "peak_mem", "bubble");
    os << buf;
    int i = 0;
    for (const PlanResult& r : out.plans) {
      const ParallelLayout& c = r.config;
      std::snprintf(
          buf, sizeof buf,
          "%-3d %3d%s %3d %5d%s %3d %3d %5d %-12s %-9s %2s %4s %10s %8.1f %5.1f%% %10s %6.1f%%\n",
          ++i, c.tensor, column(context, std::to_string(c.context)).c_str(), c.pipeline, c.data,
          column(moe, std::to_string(c.expert)).c_str(), c.virtual_stages, c.micro_batch_size,
          c.num_microbatches, to_string(c.schedule), to_string(c.recompute),
          c.sequence_parallel ? "y" : "n", c.distributed_optimizer ? "y" : "n",
          seconds_text(r.time.iteration_s).c_str(), r.tflops_per_gpu, r.mfu * 100,
          bytes_text(r.peak_memory).c_str(), r.time.bubble_fraction * 100);
      os << buf;
    }
    const PlanResult& best = out.plans.front();
    os << "\nchosen plan: " << best.placement << "\n";
    os << "  time: iteration " << seconds_text(best.time.iteration_s) << " (pipeline "
       << seconds_text(best.time.pipeline_s) << " incl. bubble "
       << percent_text(best.time.bubble_fraction) << ", exposed TP "
       << seconds_text(best.time.tp_exposed_s) << ", "
       << (best.config.expert > 1 ? "all-to-all " + seconds_text(best.time.ep_exposed_s) + ", "
                                  : std::string());
    if (best.config.context > 1)
      os << "exposed ring " << seconds_text(best.time.cp_exposed_s) << ", ";
    os << "exposed DP " << seconds_text(best.time.dp_exposed_s) << ", optimizer "
       << seconds_text(best.time.optimizer_s) << ")\n";
    const ParallelLayout& c = best.config;
    // The layers column as wide as its longest entry (interleaved plans list every chunk).
    std::vector<std::string> stage_layers;
    size_t width = 6;
    for (int s = 0; s < c.pipeline; ++s) {
      std::string layers;
      for (int ch = 0; ch < c.virtual_stages; ++ch) {
        layers += (ch ? "+" : "") +
                  std::to_string(c.layers_per_piece[static_cast<size_t>(ch * c.pipeline + s)]);
      }
      if (s == 0) layers += " +emb";
      if (s == c.pipeline - 1) layers += " +head";
      width = std::max(width, layers.size());
      stage_layers.push_back(layers);
    }
    const int w = static_cast<int>(width);
    std::snprintf(buf, sizeof buf, "  %-5s %-*s %11s %11s %11s %11s %11s %11s\n", "stage", w,
                  "layers", "parameters", "gradients", "optimizer", "activations", "buffers",
                  "total");
    os << buf;
    for (int s = 0; s < c.pipeline; ++s) {
      const MemoryBreakdown& m = best.memory[static_cast<size_t>(s)];
      std::snprintf(buf, sizeof buf, "  %-5d %-*s %11s %11s %11s %11s %11s %11s\n", s, w,
                    stage_layers[static_cast<size_t>(s)].c_str(), bytes_text(m.parameters).c_str(),
                    bytes_text(m.gradients).c_str(), bytes_text(m.optimizer).c_str(),
                    bytes_text(m.activations).c_str(), bytes_text(m.buffers).c_str(),
                    bytes_text(m.total()).c_str());
      os << buf;
    }
    const std::vector<RefusalLine> lines = refusal_lines(out);
    if (!lines.empty()) {
      os << "\nrejected families (tensor, context, pipeline, schedule), by reason:\n";
      print_rejections(out, os);
    }
  }
}

// What differs between --measured's run (its log.trace's description, TimelinePanel::run) and the
// chosen plan drawn above it: the layout's fields, the kind of device, the model's size. "" when
// nothing does; a note when the trace does not describe its run.
std::string measured_differences(const json& run, const PlanRequest& req, const PlanResult& best) {
  if (!run.is_object() || !run.contains("layout") || !run["layout"].is_object())
    return "the trace does not record its run's layout and device (written by an older strata "
           "train), so it is not checked against the plan";
  std::vector<std::string> diffs;
  const json plan = plan_config_json(best.config), &ran = run["layout"];
  std::string layout;
  for (const char* k : {"tensor", "context", "expert", "pipeline", "data", "virtual_stages",
                        "micro_batch_size", "num_microbatches", "schedule", "recompute"}) {
    if (!ran.contains(k) || ran[k] == plan[k]) continue;
    const auto text = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    layout += std::string(layout.empty() ? "" : ", ") + k + " " + text(ran[k]) + " (plan " +
              text(plan[k]) + ")";
  }
  if (!layout.empty()) diffs.push_back("layout " + layout);
  if (run.contains("device") && run["device"].is_string()) {
    const std::string device = run["device"].get<std::string>();
    const bool run_cpu = device == "cpu";
    if (run_cpu != req.cluster.cpu)
      diffs.push_back("device " + device + " (plan: cluster " + req.cluster.name + ", a " +
                      (req.cluster.cpu ? "cpu" : "gpu") + ")");
  }
  if (run.contains("parameters") && run["parameters"].is_number()) {
    const double ran_p = run["parameters"].get<double>(), plan_p = double(req.model->parameters());
    if (std::abs(ran_p - plan_p) > 1e-3 * std::max(ran_p, plan_p)) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "model %.4g parameters (plan %.4g)", ran_p, plan_p);
      diffs.push_back(buf);
    }
  }
  std::string out;
  for (const std::string& d : diffs) out += (out.empty() ? "" : "; ") + d;
  return out.empty() ? "" : "the run differs from the plan drawn above it: " + out;
}

// --trace and --svg: the chosen plan's simulated iteration as a Chrome trace and as a picture
// (with --measured, a run's log.trace drawn below it; a warning on stderr when that run is not
// the plan's layout, device or model).
void draw_chosen_plan(const PlanRequest& req, const PlanOutput& out, const std::string& trace_out,
                      const std::string& svg_out, const std::string& measured, int iteration) {
  if (out.plans.empty())
    bad_flag(trace_out.empty() ? "--svg" : "--trace", "a plan to draw, but no plan fits");
  CostContext ctx{req.model.get(), &req.cluster, req.precision, req.profile, runtime_for(req)};
  const PlanResult& best = out.plans.front();
  const IterationTime it = iteration_time(ctx, best.config, true);
  if (!trace_out.empty()) {
    std::ofstream f(trace_out);
    f << chrome_trace_json(it.sim, 1e6) << "\n";
    if (!f) throw InputError("<command line>", "--trace", "a writable path, got " + trace_out);
    std::printf("trace: the chosen plan's predicted iteration -> %s (Perfetto, chrome://tracing)\n",
                trace_out.c_str());
  }
  if (!svg_out.empty()) {
    const ParallelLayout& c = best.config;
    char title[256];
    std::snprintf(title, sizeof title,
                  "predicted: %s on %s, t %d%s p %d d %d v %d, b %d × %d, %s, %.4g s per iteration",
                  req.model_name.c_str(), req.cluster.name.c_str(), c.tensor,
                  c.context > 1 ? (" c " + std::to_string(c.context)).c_str() : "", c.pipeline,
                  c.data, c.virtual_stages, c.micro_batch_size, c.num_microbatches,
                  to_string(c.schedule), best.time.iteration_s);
    std::vector<TimelinePanel> panels = {plan_panel(best, it, req.cluster, title)};
    if (!measured.empty()) {
      panels.push_back(trace_panel(read_json_file(measured), iteration, measured));
      const std::string diff = measured_differences(panels.back().run, req, best);
      if (!diff.empty())
        std::fprintf(stderr, "warning: --measured %s: %s\n", measured.c_str(), diff.c_str());
    }
    std::ofstream f(svg_out);
    f << timeline_svg(panels);
    if (!f) throw InputError("<command line>", "--svg", "a writable path, got " + svg_out);
    std::printf("svg: the chosen plan's predicted iteration%s -> %s\n",
                measured.empty() ? "" : (" above " + measured).c_str(), svg_out.c_str());
  }
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  std::string model, cluster_name, fix, json_out, trace_out, precision = "bf16", profile_path;
  std::string svg_out, measured;
  int batch = 0, nodes = 0, top = 5, seq = 0, iteration = 0;
  bool precision_given = false;
  const std::vector<Flag> flags = {
      text_flag("--model", &model),
      text_flag("--cluster", &cluster_name),
      positive_flag("--global-batch-size", &batch),
      positive_flag("--nodes", &nodes),
      value_flag("--fix", [&fix](const std::string& v) { fix += (fix.empty() ? "" : ",") + v; }),
      positive_flag("--top", &top),
      text_flag("--json", &json_out),
      text_flag("--trace", &trace_out),
      positive_flag("--seq-len", &seq),
      value_flag("--precision",
                 [&precision, &precision_given](const std::string& v) {
                   if (v != "bf16" && v != "fp32")
                     bad_flag("--precision", "bf16 or fp32, got '" + v + "'");
                   precision = v;
                   precision_given = true;
                 }),
      text_flag("--profile", &profile_path),
      text_flag("--svg", &svg_out),
      text_flag("--measured", &measured),
      positive_flag("--iteration", &iteration),
  };
  if (!read_flags(args, flags, kPlanUsage, "an option of strata plan (see strata plan --help)"))
    return 0;
  if (model.empty()) bad_flag("--model", "a model: strata plan --model PRESET|FILE ...");
  if (cluster_name.empty()) bad_flag("--cluster", "a cluster: --cluster PRESET|FILE");
  if (!json_out.empty()) check_output_flag("--json", json_out);
  if (!trace_out.empty()) check_output_flag("--trace", trace_out);
  if (!svg_out.empty()) check_output_flag("--svg", svg_out);
  if (svg_out.empty() && !measured.empty())
    bad_flag("--measured", "--svg OUT with it (the picture the measured run is drawn into)");
  if (measured.empty() && iteration > 0)
    bad_flag("--iteration", "--measured LOG.trace with it (the run whose iteration to draw)");

  std::vector<std::string> sets;
  if (seq > 0) sets.push_back("model.seq_len=" + std::to_string(seq));
  const Config cfg = model_config(model, sets);
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.model_name = model;
  std::error_code ec;
  if (std::filesystem::is_regular_file(model, ec)) {
    // The file, and the preset it names (a model file without one is not the default preset).
    const json j = read_json_file(model);
    const json& m = j.contains("model") ? j["model"] : j;
    if (m.is_object() && m.contains("preset") && m["preset"].is_string())
      req.model_name = m["preset"].get<std::string>() + " (" + model + ")";
    // A whole config (a file with a train section) gives what the flags leave open: its
    // precision, its global batch, and its micro-batch when it sets one (pinned as --fix would).
    if (j.contains("train") && j["train"].is_object()) {
      if (!precision_given) precision = cfg.train.precision;
      if (batch == 0) batch = cfg.train.global_batch_size;
      if (j["train"].contains("micro_batch_size") &&
          fix.find("micro_batch_size") == std::string::npos)
        fix += (fix.empty() ? "" : ",") +
               ("micro_batch_size=" + std::to_string(cfg.layout.micro_batch_size));
    }
  }
  if (batch == 0)
    bad_flag("--global-batch-size",
             "the global batch: --global-batch-size B (or --model a config with "
             "train.global_batch_size)");
  req.cluster = load_cluster(cluster_name, configs_dir());
  if (nodes > 0) req.cluster.nodes = nodes;
  req.global_batch_size = batch;
  req.precision = precision;
  // Refuses a precision the cluster has no figure for, naming the one it has.
  if (precision == "bf16" && req.cluster.peak_flops.count("bf16") == 0 &&
      req.cluster.peak_flops.count("fp16") == 0 && req.cluster.peak_flops.count("fp32") != 0)
    throw InputError(req.cluster.name, "peak_flops.bf16",
                     "a peak FLOP/s for precision bf16 in the cluster, which has fp32 only: "
                     "strata plan --precision fp32 (or a config with train.precision \"fp32\")");
  req.cluster.peak(precision);
  req.fixes = parse_layout_fixes(fix);
  req.top_k = top;
  req.memory = memory_options(precision, MemoryOptions{}.bucket_mb, 1, precision == "fp32");
  Profile profile;
  if (!profile_path.empty()) {
    profile = load_profile(profile_path);
    check_profile_matches(profile, *req.model, precision, profile_path);
    req.profile = &profile;
  }
  PlanOutput out =
      with_memory_named({"searching layouts", "", ""}, [&] { return search_plans(req); });
  if (out.candidates == 0) {
    // Nothing to cost: the pins (or the batch against the cluster) exclude every layout. A
    // refusal of the request, one line naming what excluded what.
    std::string why;
    for (const RefusalLine& l : refusal_lines(out)) why += (why.empty() ? "" : "; ") + l.text;
    const bool pinned = !fix.empty();
    throw InputError("<command line>", pinned ? "--fix" : "--global-batch-size",
                     std::string(pinned ? "pins" : "a global batch") +
                         " that leave a layout to try, but the search tried none: " + why);
  }
  if (out.plans.empty())
    out.bottom_line =
        with_memory_named({"searching layouts", "", ""}, [&] { return bottom_line(req); });
  print_table(req, out, std::cout);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << plan_output_json(req, out).dump(2) << "\n";
    if (!f) throw InputError("<command line>", "--json", "a writable path, got " + json_out);
  }
  if (!trace_out.empty() || !svg_out.empty())
    draw_chosen_plan(req, out, trace_out, svg_out, measured, iteration);
  return 0;
}

}  // namespace strata
