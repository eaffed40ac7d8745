#include "launch/commands/plan.h"

#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "launch/args.h"
#include "launch/commands/timeline_svg.h"
#include "launch/config/config_parse.h"
#include "launch/train/checkpointing.h"
#include "models/registry.h"
#include "partitioner/cost_model.h"
#include "partitioner/layer_split.h"
#include "partitioner/planner.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

using nlohmann::json;

const char* kPlanUsage =
    "usage: strata plan --model FILE|PRESET --cluster FILE|PRESET --global-batch-size B\n"
    "                   [--nodes N] [--fix k=v,...] [--top K] [--json OUT] [--trace OUT]\n"
    "                   [--seq-len S] [--precision bf16|fp32] [--profile PROFILE.json]\n"
    "                   [--svg OUT [--measured LOG.trace [--iteration N]]]\n"
    "\n"
    "Searches tensor, pipeline and data parallel sizes, virtual stages, micro-batch size,\n"
    "schedule, recomputation, sequence parallelism and the distributed optimizer for the\n"
    "fastest layout that fits in memory; prints the best plans, then the chosen plan's\n"
    "per-stage layers and memory. Cost and memory model: docs/planner.md.\n"
    "\n"
    "options:\n"
    "  --model M              a preset (gpt2-124m, gpt3-175b, ...), a JSON model object, or\n"
    "                         a whole config (its model section is used)\n"
    "  --cluster C            a preset (dgx-a100-80gb, dgx-h100, p3.16xlarge, cpu-local) or a\n"
    "                         JSON file, e.g. one written by strata profile --cluster-out\n"
    "  --global-batch-size B  sequences per iteration\n"
    "  --nodes N              override the cluster's node count\n"
    "  --fix k=v,...          pin plan fields: tensor, pipeline, data, virtual_stages,\n"
    "                         micro_batch_size, schedule, recompute, sequence_parallel,\n"
    "                         distributed_optimizer; the rest is searched\n"
    "  --top K                plans to print (default 5)\n"
    "  --json OUT             write the plans and the rejected families as JSON\n"
    "  --trace OUT            write the chosen plan's simulated timeline as a Chrome trace\n"
    "  --svg OUT              draw the chosen plan's predicted iteration (a row per stage:\n"
    "                         forward, backward, weight, communication, optimizer, idle) and\n"
    "                         each stage's memory as a stacked bar, as an SVG\n"
    "  --measured LOG.trace   with --svg: also draw a run's log.trace (strata train) below it,\n"
    "                         on the same time scale; --iteration N picks its iteration\n"
    "                         (default: the last complete one)\n"
    "  --seq-len S            override the model's sequence length\n"
    "  --precision P          bf16 (default) or fp32\n"
    "  --profile FILE         measured per-layer times (strata profile) instead of the\n"
    "                         analytical compute model\n"
    "  --help                 this text\n"
    "\n"
    "exit status: 0 done (also when nothing fits: the reasons are printed), 2 bad input\n";

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

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

void print_table(const PlanRequest& req, const PlanOutput& out, std::ostream& os) {
  char buf[256];
  const ModelDescription& model = *req.model;
  os << "model: " << req.model_name << " (" << model.parameters() / 1e9 << "B parameters, "
     << model.num_layers() << " layers, hidden " << model.hidden_size() << ", seq "
     << model.seq_len() << ", vocab " << model.vocab_size() << ")\n";
  os << "cluster: " << req.cluster.name << ", " << req.cluster.nodes << " × "
     << req.cluster.gpus_per_node << " GPUs, " << gib(req.cluster.memory_bytes) << " each, "
     << req.precision << " peak " << req.cluster.peak(req.precision) / 1e12 << " TFLOP/s\n";
  const double mf = model.flops_per_iteration(req.global_batch_size, Recompute::kNone).model;
  os << "global batch " << req.global_batch_size << ": model FLOPs per iteration " << mf
     << " (hardware FLOPs add the recomputed forward passes)\n";
  os << "searched " << out.candidates << " configurations in " << out.search_s * 1e3 << " ms\n\n";
  if (out.plans.empty()) {
    os << "no plan fits; reasons by family (tensor, pipeline, schedule):\n";
  } else {
    std::snprintf(buf, sizeof buf,
                  "%-3s %3s %3s %5s %3s %3s %5s %-12s %-9s %2s %4s %10s %8s %6s %10s %7s\n", "#",
                  "t", "p", "d", "v", "b", "m", "schedule", "recompute", "sp", "dopt", "iter_s",
                  "TFLOP/s", "MFU", "peak_mem", "bubble");
    os << buf;
    int i = 0;
    for (const PlanResult& r : out.plans) {
      const PlanConfig& c = r.config;
      std::snprintf(
          buf, sizeof buf,
          "%-3d %3d %3d %5d %3d %3d %5d %-12s %-9s %2s %4s %10.4f %8.1f %5.1f%% %10s %6.1f%%\n",
          ++i, c.tensor, c.pipeline, c.data, c.virtual_stages, c.micro_batch_size,
          c.num_microbatches, to_string(c.schedule), to_string(c.recompute),
          c.sequence_parallel ? "y" : "n", c.distributed_optimizer ? "y" : "n", r.time.iteration_s,
          r.tflops_per_gpu, r.mfu * 100, gib(r.peak_memory).c_str(), r.time.bubble_fraction * 100);
      os << buf;
    }
    const PlanResult& best = out.plans.front();
    os << "\nchosen plan: " << best.placement << "\n";
    os << "  time: iteration " << best.time.iteration_s << " s (pipeline " << best.time.pipeline_s
       << " s incl. bubble " << best.time.bubble_fraction * 100 << "%, exposed TP "
       << best.time.tp_exposed_s << " s, exposed DP " << best.time.dp_exposed_s << " s, optimizer "
       << best.time.optimizer_s << " s)\n";
    std::snprintf(buf, sizeof buf, "  %-5s %-14s %11s %11s %11s %11s %11s %11s\n", "stage",
                  "layers", "parameters", "gradients", "optimizer", "activations", "buffers",
                  "total");
    os << buf;
    const PlanConfig& c = best.config;
    for (int s = 0; s < c.pipeline; ++s) {
      std::string layers;
      for (int ch = 0; ch < c.virtual_stages; ++ch) {
        layers += (ch ? "+" : "") +
                  std::to_string(c.layers_per_piece[static_cast<size_t>(ch * c.pipeline + s)]);
      }
      if (s == 0) layers += " +emb";
      if (s == c.pipeline - 1) layers += " +head";
      const MemoryBreakdown& m = best.memory[static_cast<size_t>(s)];
      std::snprintf(buf, sizeof buf, "  %-5d %-14s %11s %11s %11s %11s %11s %11s\n", s,
                    layers.c_str(), gib(m.parameters).c_str(), gib(m.gradients).c_str(),
                    gib(m.optimizer).c_str(), gib(m.activations).c_str(), gib(m.buffers).c_str(),
                    gib(m.total()).c_str());
      os << buf;
    }
    os << "\nrejected families (tensor, pipeline, schedule):\n";
  }
  for (const Rejection& r : out.rejected) {
    if (!r.config.contains("micro_batch_size")) {
      os << "  t=" << r.config["tensor"] << " p=" << r.config["pipeline"] << " "
         << r.config["schedule"].get<std::string>() << ": " << r.reason << "\n";
    }
  }
}

// cpu: the CPU runtime (also for bf16, which it emulates: memory there follows fp32's layout
// rules for attention); else a GPU.
MemoryOptions memory_options(const std::string& precision, const ParallelConfig* par, int threads,
                             bool cpu) {
  MemoryOptions o;
  o.precision = precision;
  if (cpu) {
    // The CPU runtime: unfused attention keeps the probabilities; per-thread scratch.
    o.flash_attention = false;
    o.cpu_threads = threads;
  } else {
    o.flash_attention = true;
    o.reserve_bytes = 1024.0 * 1024.0 * 1024.0;  // CUDA context, NCCL, fragmentation
    o.workspace_bytes = 32.0 * 1024 * 1024;  // cuBLASLt's (runtime/backend/cuda/backend_cuda.cu)
  }
  if (par != nullptr) o.bucket_mb = par->bucket_mb;
  return o;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  std::string model, cluster_name, fix, json_out, trace_out, precision = "bf16", profile_path;
  std::string svg_out, measured;
  int batch = 0, nodes = 0, top = 5, seq = 0, iteration = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag, std::string* dst) { return flag_value(args, i, flag, dst); };
    std::string v;
    if (a == "--help" || a == "-h") {
      std::fputs(kPlanUsage, stdout);
      return 0;
    } else if (value("--model", &v)) {
      model = v;
    } else if (value("--cluster", &v)) {
      cluster_name = v;
    } else if (value("--global-batch-size", &v)) {
      batch = positive_int("--global-batch-size", v);
    } else if (value("--nodes", &v)) {
      nodes = positive_int("--nodes", v);
    } else if (value("--fix", &v)) {
      fix += (fix.empty() ? "" : ",") + v;
    } else if (value("--top", &v)) {
      top = positive_int("--top", v);
    } else if (value("--json", &v)) {
      json_out = v;
    } else if (value("--trace", &v)) {
      trace_out = v;
    } else if (value("--seq-len", &v)) {
      seq = positive_int("--seq-len", v);
    } else if (value("--precision", &v)) {
      if (v != "bf16" && v != "fp32") bad_flag("--precision", "bf16 or fp32, got '" + v + "'");
      precision = v;
    } else if (value("--profile", &v)) {
      profile_path = v;
    } else if (value("--svg", &v)) {
      svg_out = v;
    } else if (value("--measured", &v)) {
      measured = v;
    } else if (value("--iteration", &v)) {
      iteration = positive_int("--iteration", v);
    } else {
      bad_flag(a, "an option of strata plan (see strata plan --help)");
    }
  }
  if (model.empty()) bad_flag("--model", "a model: strata plan --model PRESET|FILE ...");
  if (cluster_name.empty()) bad_flag("--cluster", "a cluster: --cluster PRESET|FILE");
  if (batch == 0) bad_flag("--global-batch-size", "the global batch: --global-batch-size B");
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
  }
  req.cluster = load_cluster(cluster_name, configs_dir());
  if (nodes > 0) req.cluster.nodes = nodes;
  req.global_batch_size = batch;
  req.precision = precision;
  req.cluster.peak(precision);  // refuses a precision the cluster has no figure for
  req.fixes = parse_fixes(fix);
  req.top_k = top;
  req.memory = memory_options(precision, nullptr, 1, precision == "fp32");
  Profile profile;
  if (!profile_path.empty()) {
    profile = load_profile(profile_path);
    check_profile_matches(profile, *req.model, precision, profile_path);
    req.profile = &profile;
  }
  const PlanOutput out = search_plans(req);
  print_table(req, out, std::cout);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << plan_output_json(req, out).dump(2) << "\n";
    if (!f) throw InputError("<command line>", "--json", "a writable path, got " + json_out);
  }
  if (!trace_out.empty() || !svg_out.empty()) {
    if (out.plans.empty())
      bad_flag(trace_out.empty() ? "--svg" : "--trace", "a plan to draw, but no plan fits");
    CostContext ctx{req.model.get(), &req.cluster, req.precision, req.profile, runtime_for(req)};
    const PlanResult& best = out.plans.front();
    const IterationTime it = iteration_time(ctx, best.config, true);
    if (!trace_out.empty()) {
      std::ofstream f(trace_out);
      f << chrome_trace_json(it.sim, 1e6) << "\n";
      if (!f) throw InputError("<command line>", "--trace", "a writable path, got " + trace_out);
    }
    if (!svg_out.empty()) {
      const PlanConfig& c = best.config;
      char title[256];
      std::snprintf(title, sizeof title,
                    "predicted: %s on %s, t %d p %d d %d v %d, b %d × %d, %s, %.4g s per iteration",
                    req.model_name.c_str(), req.cluster.name.c_str(), c.tensor, c.pipeline, c.data,
                    c.virtual_stages, c.micro_batch_size, c.num_microbatches, to_string(c.schedule),
                    best.time.iteration_s);
      std::vector<TimelinePanel> panels = {plan_panel(best, it, req.cluster, title)};
      if (!measured.empty())
        panels.push_back(trace_panel(read_json_file(measured), iteration, measured));
      std::ofstream f(svg_out);
      f << timeline_svg(panels);
      if (!f) throw InputError("<command line>", "--svg", "a writable path, got " + svg_out);
    }
  }
  return 0;
}

PlanConfig plan_config_for(const Config& cfg, int world_size) {
  PlanConfig c;
  c.tensor = cfg.parallel.tensor;
  c.pipeline = cfg.parallel.pipeline;
  c.data = cfg.parallel.data.value_or(world_size / (c.tensor * c.pipeline));
  c.virtual_stages = cfg.parallel.virtual_stages;
  c.micro_batch_size = cfg.train.micro_batch_size;
  // The config parser accepted only known names (InputError here would be a parser bug's).
  if (!parse_schedule_kind(cfg.parallel.schedule, &c.schedule)) {
    throw InputError(cfg.source_file, "parallel.schedule", "a known schedule");
  }
  if (!parse_recompute(cfg.train.recompute, &c.recompute)) {
    throw InputError(cfg.source_file, "train.recompute", "none, selective or full");
  }
  c.sequence_parallel = cfg.parallel.sequence_parallel;
  c.distributed_optimizer = cfg.parallel.distributed_optimizer;
  // The split training runs (partitioner/layer_split.h), not one the planner would choose.
  c.layers_per_piece = layer_split(cfg.model.num_layers, c.pipeline * c.virtual_stages,
                                   cfg.parallel.layers_per_stage);
  return c;
}

json predict_for_config(const Config& cfg, int world_size, const Cluster& cluster_in) {
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.model_name = cfg.model.preset.empty() ? "custom" : cfg.model.preset;
  req.cluster = cluster_in;
  // The prediction is for this job's ranks, whatever size the cluster description has.
  if (world_size % req.cluster.gpus_per_node == 0) {
    req.cluster.nodes = world_size / req.cluster.gpus_per_node;
  } else {
    req.cluster.nodes = 1;
    req.cluster.gpus_per_node = world_size;
  }
  req.global_batch_size = cfg.train.global_batch_size;
  req.precision = cfg.train.precision;
  req.memory = memory_options(cfg.train.precision, &cfg.parallel, cfg.train.threads.value_or(1),
                              cfg.device != "cuda");
  // Strata's runtime on the config's device, whatever the cluster file says.
  req.runtime = strata_runtime(cfg.device != "cuda", cfg.train.precision, cfg.parallel.bucket_mb);
  const PlanConfig c = plan_config_for(cfg, world_size);
  const PlanResult r = evaluate_plan(req, c);
  json j = plan_result_json(r);
  const FlopCount f = req.model->flops_per_iteration(req.global_batch_size, c.recompute);
  j["model_flops"] = f.model;
  j["hardware_flops"] = f.hardware;
  return j;
}

Config apply_plan(const Config& cfg, const json& plan_in, const std::string& file) {
  using std::to_string;
  // A plan chooses the layout of one model and one global batch: applied to another it would
  // train something else than the config says (its layers, its batch), so those must match.
  if (plan_in.is_object() && plan_in.contains("model")) {
    const json& planned = plan_in["model"];
    if (!planned.is_object()) throw InputError(file, "model", "an object (the plan's model)");
    const std::unique_ptr<ModelDescription> desc = describe_model(cfg.model);
    const json shape = model_shape_json(cfg.model, *desc);
    for (const auto& [key, want] : shape.items()) {
      const auto got = planned.find(key);
      if (got == planned.end() || *got != want) {
        throw InputError(file, "model." + key,
                         "the config's model." + key + " " + want.dump() +
                             " (a plan is made for one model), got " +
                             (got == planned.end() ? std::string("none") : got->dump()));
      }
    }
  }
  if (plan_in.is_object() && plan_in.contains("global_batch_size")) {
    const json& g = plan_in["global_batch_size"];
    if (!g.is_number_integer() || g.get<int64_t>() != cfg.train.global_batch_size) {
      throw InputError(file, "global_batch_size",
                       "the config's train.global_batch_size " +
                           to_string(cfg.train.global_batch_size) + ", got " + g.dump());
    }
  }
  std::string prefix;
  const json* plan = &plan_in;
  if (plan_in.is_object() && plan_in.contains("plans")) {
    if (!plan_in["plans"].is_array() || plan_in["plans"].empty()) {
      throw InputError(file, "plans", "a non-empty array of plans (no plan fitted?)");
    }
    plan = &plan_in["plans"][0];
    prefix = "plans[0].";
  }
  if (!plan->is_object()) throw InputError(file, prefix.empty() ? "" : "plans[0]", "a plan object");
  auto need_int = [&](const char* key) {
    const json* v = plan->contains(key) ? &(*plan)[key] : nullptr;
    if (!v || !v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > INT_MAX) {
      throw InputError(file, prefix + key, "a positive integer up to " + to_string(INT_MAX));
    }
    return v->get<int>();
  };
  auto need_str = [&](const char* key) {
    if (!plan->contains(key) || !(*plan)[key].is_string())
      throw InputError(file, prefix + key, "a string");
    return (*plan)[key].get<std::string>();
  };
  auto need_bool = [&](const char* key) {
    if (!plan->contains(key) || !(*plan)[key].is_boolean())
      throw InputError(file, prefix + key, "true or false");
    return (*plan)[key].get<bool>();
  };
  const int tensor = need_int("tensor"), pipeline = need_int("pipeline"), data = need_int("data");
  const int virtual_stages = need_int("virtual_stages");
  const std::string schedule = need_str("schedule");
  ScheduleKind k;
  if (!parse_schedule_kind(schedule, &k)) {
    throw InputError(file, prefix + "schedule", "gpipe, 1f1b, interleaved, 2bw or zb-h1");
  }
  const int micro = need_int("micro_batch_size");
  const std::string recompute = need_str("recompute");
  Recompute rk;
  if (!parse_recompute(recompute, &rk)) {
    throw InputError(file, prefix + "recompute", "none, selective or full");
  }
  // Micro-batch size × micro-batches × data-parallel size is the global batch: the config's.
  if (plan->contains("num_microbatches")) {
    const int m = need_int("num_microbatches");
    const int64_t global = int64_t{micro} * m * data;
    if (global != cfg.train.global_batch_size) {
      throw InputError(file, prefix + "num_microbatches",
                       "micro_batch_size " + to_string(micro) + " × num_microbatches " +
                           to_string(m) + " × data " + to_string(data) +
                           " = the config's train.global_batch_size " +
                           to_string(cfg.train.global_batch_size) + ", got " + to_string(global));
    }
  }
  json layout = {{"tensor", tensor},
                 {"pipeline", pipeline},
                 {"data", data},
                 {"virtual_stages", virtual_stages},
                 {"schedule", schedule},
                 {"sequence_parallel", need_bool("sequence_parallel")},
                 {"distributed_optimizer", need_bool("distributed_optimizer")},
                 {"layers_per_stage", nullptr}};
  if (plan->contains("layers_per_stage") && !(*plan)["layers_per_stage"].is_null()) {
    // [stage][chunk] in the plan; chunk-major (chunk · pipeline + stage) in the config.
    const json& l = (*plan)["layers_per_stage"];
    const std::string w = prefix + "layers_per_stage";
    if (!l.is_array() || static_cast<int64_t>(l.size()) != pipeline) {
      throw InputError(file, w, "an array of " + to_string(pipeline) + " stages");
    }
    for (int s = 0; s < pipeline; ++s) {
      const json& row = l[static_cast<size_t>(s)];
      if (!row.is_array() || static_cast<int64_t>(row.size()) != virtual_stages) {
        throw InputError(file, w + "[" + to_string(s) + "]",
                         "an array of " + to_string(virtual_stages) + " layer counts");
      }
    }
    std::vector<int> pieces(static_cast<size_t>(pipeline) * static_cast<size_t>(virtual_stages));
    int64_t sum = 0;
    for (int s = 0; s < pipeline; ++s) {
      for (int ch = 0; ch < virtual_stages; ++ch) {
        const json& n = l[static_cast<size_t>(s)][static_cast<size_t>(ch)];
        if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > INT_MAX) {
          throw InputError(file, w + "[" + to_string(s) + "][" + to_string(ch) + "]",
                           "a positive layer count");
        }
        pieces[static_cast<size_t>(ch) * static_cast<size_t>(pipeline) + static_cast<size_t>(s)] =
            n.get<int>();
        sum += n.get<int64_t>();
      }
    }
    if (sum != cfg.model.num_layers) {
      throw InputError(file, w,
                       "layer counts summing to the config's model.num_layers " +
                           to_string(cfg.model.num_layers) +
                           " (every layer in exactly one stage), got " + to_string(sum));
    }
    layout["layers_per_stage"] = pieces;
  }
  // The layout is then checked as if the config had said it, against the config's other keys.
  return config_with_layer(
      cfg,
      {{"parallel", layout}, {"train", {{"micro_batch_size", micro}, {"recompute", recompute}}}},
      file);
}

}  // namespace strata
